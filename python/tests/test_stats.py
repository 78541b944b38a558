"""PyTorch's memory statistics answered by the library, on the simulated
device (no GPU, no torch): the schema of torch.cuda.memory_stats, the
counts through the C fast path and through Go, peaks and their reset, out
of memory counted, and the redirect of torch's bindings."""
import os
import sys
import types
import unittest

os.environ["ARENAPLAN_DEVICE"] = "sim"  # read once, when the library loads
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from arenaplan._lib import Library  # noqa: E402
from arenaplan import _stats  # noqa: E402

LIB = Library()
STATS = _stats.Stats(LIB)

# torch.cuda.memory_stats's keys (torch/csrc/cuda/Module.cpp, memoryStats).
POOLED = ["allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
          "active_bytes", "inactive_split_bytes", "requested_bytes"]
SCALARS = ["num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc",
           "num_device_free"]
FIELDS = ["current", "peak", "allocated", "freed"]


def flat(d, prefix=""):
    """torch.cuda.memory_stats's flattening of the nested dict."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


class StatsTest(unittest.TestCase):
    def setUp(self):
        LIB.captures_underway(0)  # as arenaplan.torch does: the fast path opens

    def test_schema(self):
        keys = set(flat(STATS.memory_stats(0)))
        want = set(SCALARS)
        want |= {f"{s}.{p}.{f}" for s in POOLED for p in ("all", "small_pool", "large_pool") for f in FIELDS}
        want |= {f"{s}.{f}" for s in ("oversize_allocations", "oversize_segments") for f in FIELDS}
        self.assertEqual(keys, want)
        for k, v in flat(STATS.memory_stats(0)).items():
            self.assertIsInstance(v, int, k)

    def test_counts_fast_path_and_go(self):
        s = "0x77"
        stream = 0x4321
        before = flat(STATS.memory_stats(0))
        a = LIB.alloc(3000, 0, stream)       # Go (first of its size)
        LIB.free(a, 3000, 0, stream)         # kept by the fast path
        b = LIB.alloc(3000, 0, stream)       # served by the fast path
        big = LIB.alloc(3 << 20, 0, stream)  # large pool
        now = flat(STATS.memory_stats(0))
        self.assertEqual(b, a, s)
        d = lambda k: now[k] - before[k]  # noqa: E731
        self.assertEqual(d("allocated_bytes.all.current"), 3072 + (3 << 20))
        self.assertEqual(d("requested_bytes.all.current"), 3000 + (3 << 20))
        self.assertEqual(d("allocated_bytes.small_pool.current"), 3072)
        self.assertEqual(d("allocated_bytes.large_pool.current"), 3 << 20)
        self.assertEqual(d("allocation.all.allocated"), 3)
        self.assertEqual(d("allocation.all.freed"), 1)
        self.assertGreaterEqual(now["reserved_bytes.all.current"], now["allocated_bytes.all.current"])
        LIB.free(b, 3000, 0, stream)
        LIB.free(big, 3 << 20, 0, stream)
        after = flat(STATS.memory_stats(0))
        self.assertEqual(after["allocated_bytes.all.current"], before["allocated_bytes.all.current"])
        self.assertGreaterEqual(after["allocated_bytes.all.peak"], before["allocated_bytes.all.current"] + (3 << 20))

    def test_peak_reset_and_ooms(self):
        p = LIB.alloc(8 << 20)
        LIB.free(p, 8 << 20)
        STATS.reset_peak(0)
        st = flat(STATS.memory_stats(0))
        self.assertEqual(st["allocated_bytes.all.peak"], st["allocated_bytes.all.current"])
        self.assertEqual(st["reserved_bytes.all.peak"], st["reserved_bytes.all.current"])
        ooms = st["num_ooms"]
        self.assertEqual(LIB.alloc(1 << 50), 0)
        self.assertIn("CUDA out of memory.", LIB.last_error())
        self.assertEqual(flat(STATS.memory_stats(0))["num_ooms"], ooms + 1)
        STATS.reset_accumulated(0)
        st = flat(STATS.memory_stats(0))
        self.assertEqual((st["num_ooms"], st["allocation.all.allocated"], st["allocation.all.freed"]), (0, 0, 0))

    def test_redirects_torch_bindings(self):
        def refuse(*_):
            raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats")
        C = types.SimpleNamespace(_cuda_memoryStats=refuse, _cuda_resetPeakMemoryStats=refuse,
                                  _cuda_resetAccumulatedMemoryStats=refuse)
        torch = types.SimpleNamespace(_C=C, cuda=types.SimpleNamespace(current_device=lambda: 0),
                                      device=lambda d: types.SimpleNamespace(index=0))
        _stats.install(LIB, torch)
        self.assertIn("allocated_bytes", C._cuda_memoryStats(0))
        self.assertIn("reserved_bytes", C._cuda_memoryStats(None))
        C._cuda_resetPeakMemoryStats(0)
        C._cuda_resetAccumulatedMemoryStats("cuda:0")
        self.assertFalse(hasattr(C, "_accelerator_getDeviceStats"))  # only what torch has


if __name__ == "__main__":
    unittest.main()
