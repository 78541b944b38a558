"""torch.cuda.MemPool and use_mem_pool answered by the library, on the
simulated device (no GPU, no torch): a stand-in torch whose
CUDAPluggableAllocator behaves as PyTorch's (dlopen a library, take two
function names), pools with their own allocator (Python callbacks called
from the library through C function pointers, and libc's valloc/free
through a pluggable allocator), pools of arenaplan's memory, nesting,
other threads, release."""
import ctypes
import ctypes.util
import gc
import os
import sys
import threading
import types
import unittest
import warnings

os.environ["ARENAPLAN_DEVICE"] = "sim"  # read once, when the library loads
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from arenaplan._lib import ArenaplanError, Library  # noqa: E402
from arenaplan import _mempool  # noqa: E402

LIB = Library()
MiB = 1 << 20

ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class RecordingAllocator:
    """A pool allocator in Python, called by the library through C function
    pointers: segments are carved from one host buffer (the simulated
    device never touches a pool's memory) and every call is recorded."""

    def __init__(self, space=256 * MiB):
        self.buf = ctypes.create_string_buffer(space + 2 * MiB)
        base = ctypes.addressof(self.buf)
        self.next = (base + 2 * MiB - 1) & ~(2 * MiB - 1)
        self.end = base + space
        self.live = {}
        self.asked, self.freed, self.bad = [], [], []
        self.c_alloc, self.c_free = ALLOC_FN(self._alloc), FREE_FN(self._free)

    def _alloc(self, size, device, stream):
        if self.next + size > self.end:
            return None
        p = self.next
        self.next += (size + 2 * MiB - 1) & ~(2 * MiB - 1)
        self.live[p] = size
        self.asked.append(size)
        return p

    def _free(self, ptr, size, device, stream):
        if self.live.pop(ptr, None) != size:
            self.bad.append((ptr, size))
        self.freed.append(size)

    def addresses(self):
        return (ctypes.cast(self.c_alloc, ctypes.c_void_p).value, ctypes.cast(self.c_free, ctypes.c_void_p).value)

    def holds(self, p, n=1):
        return any(s <= p and p + n <= s + size for s, size in self.live.items())


def stand_in_torch():
    """What _mempool.install touches of torch, shaped as torch 2.11's."""

    class CUDAPluggableAllocator:  # torch/cuda/memory.py's, minus torch._C
        def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
            so = ctypes.CDLL(path_to_so_file)
            self.alloc_address = ctypes.cast(getattr(so, alloc_fn_name), ctypes.c_void_p).value
            self._allocator = types.SimpleNamespace(kind="_cuda_CUDAAllocator")

    def refuse(*_a, **_k):
        raise RuntimeError("pluggable does not yet support createOrIncrefPool")

    memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator, MemPool=refuse,
                                   use_mem_pool=refuse)
    cuda = types.SimpleNamespace(memory=memory, MemPool=refuse, use_mem_pool=refuse, current_device=lambda: 0)
    return types.SimpleNamespace(cuda=cuda, device=lambda d: types.SimpleNamespace(index=0))


TORCH = stand_in_torch()
POOLS = _mempool.install(LIB, TORCH)


class MemPoolTest(unittest.TestCase):
    def setUp(self):
        LIB.captures_underway(0)  # as arenaplan.torch does: the fast path opens

    def pool_with(self, alloc):
        obj = types.SimpleNamespace()  # stands for a pluggable allocator's _allocator
        _mempool._remember(obj, *alloc.addresses())
        return TORCH.cuda.MemPool(obj)

    def test_installed_on_both_modules(self):
        self.assertIs(TORCH.cuda.MemPool, TORCH.cuda.memory.MemPool)
        self.assertIs(TORCH.cuda.use_mem_pool, TORCH.cuda.memory.use_mem_pool)
        pool = TORCH.cuda.MemPool()
        self.assertEqual(pool.id[0], 0)
        self.assertIsInstance(pool.id, tuple)
        self.assertIsNone(pool.allocator)
        self.assertEqual(pool.use_count(), 1)
        self.assertNotEqual(TORCH.cuda.MemPool().id, pool.id)

    def test_graph_memory_pool_packs_its_segments(self):
        # The pool arenaplan makes for a capture stream's workspaces: its
        # segments are each of its block's size (laid out beside the small
        # arenas), where a pool of arenaplan's memory maps a 2 MiB segment
        # for any request up to 1 MiB.
        stream = 0x53
        graphs = TORCH.cuda.MemPool(_graph_memory=True)
        plain = TORCH.cuda.MemPool()
        with TORCH.cuda.use_mem_pool(graphs):
            lt = LIB.alloc(1 * MiB, 0, stream)
            ws = LIB.alloc(3 * MiB + 4096, 0, stream)
        with TORCH.cuda.use_mem_pool(plain):
            other = LIB.alloc(1 * MiB, 0, stream)
        self.assertEqual(sorted(s["total_size"] for s in graphs.snapshot()), [1 * MiB, 3 * MiB + 4096])
        self.assertEqual([s["total_size"] for s in plain.snapshot()], [2 * MiB])
        self.assertEqual(ws, lt + 1 * MiB, "laid out side by side")
        # Freed blocks stay the pool's: the next request of the size gets one.
        LIB.free(lt, 1 * MiB, 0, stream)
        with TORCH.cuda.use_mem_pool(graphs):
            self.assertEqual(LIB.alloc(1 * MiB, 0, stream), lt)
        for p, n in ((lt, 1 * MiB), (ws, 3 * MiB + 4096), (other, 1 * MiB)):
            LIB.free(p, n, 0, stream)
        del graphs, plain
        gc.collect()

    def test_own_allocator_receives_memory(self):
        alloc = RecordingAllocator()
        pool = self.pool_with(alloc)
        stream = 0x51
        outside = []
        with TORCH.cuda.use_mem_pool(pool):
            self.assertEqual(pool.use_count(), 2)
            small = [LIB.alloc(64 << 10, 0, stream) for _ in range(16)]
            mid = LIB.alloc(5 * MiB, 0, stream)
            t = threading.Thread(target=lambda: outside.append(LIB.alloc(64 << 10, 0, stream)))
            t.start()
            t.join()
        after = LIB.alloc(64 << 10, 0, stream)
        self.assertEqual(alloc.asked, [2 * MiB, 20 * MiB])
        for p in small:
            self.assertTrue(alloc.holds(p, 64 << 10), hex(p))
        self.assertTrue(alloc.holds(mid, 5 * MiB))
        self.assertFalse(alloc.holds(outside[0]), "another thread's allocation went to the pool")
        self.assertFalse(alloc.holds(after), "an allocation after the block went to the pool")
        st = pool.stats()
        self.assertEqual(st["Devices"]["0"]["Live"], 17)
        self.assertTrue(st["OwnAlloc"])
        segs = pool.snapshot()
        self.assertEqual(sorted(s["total_size"] for s in segs), [2 * MiB, 20 * MiB])
        # A free goes back to the pool: the same block serves the next request.
        LIB.free(small[0], 64 << 10, 0, stream)
        with TORCH.cuda.use_mem_pool(pool):
            again = LIB.alloc(64 << 10, 0, stream)
        self.assertEqual(again, small[0])
        self.assertEqual(len(alloc.asked), 2)
        # Deleting the pool releases it: segments go back as they empty.
        LIB.free(mid, 5 * MiB, 0, stream)
        del pool
        gc.collect()
        self.assertEqual(alloc.freed, [20 * MiB])
        for p in small[1:] + [again]:
            LIB.free(p, 64 << 10, 0, stream)
        self.assertEqual(alloc.freed, [20 * MiB, 2 * MiB])
        self.assertEqual(alloc.live, {})
        self.assertEqual(alloc.bad, [])
        LIB.free(outside[0], 64 << 10, 0, stream)
        LIB.free(after, 64 << 10, 0, stream)

    def test_pluggable_allocator_wrapped(self):
        # libc's valloc(size) and free(ptr) as a pool's allocator: the
        # wrapper finds the functions by path and name, as PyTorch does.
        libc = ctypes.util.find_library("c")
        plug = TORCH.cuda.memory.CUDAPluggableAllocator(libc, "valloc", "free")
        self.assertEqual(_mempool.functions_of(plug._allocator),
                         (ctypes.cast(ctypes.CDLL(libc).valloc, ctypes.c_void_p).value,
                          ctypes.cast(ctypes.CDLL(libc).free, ctypes.c_void_p).value))
        pool = TORCH.cuda.MemPool(plug._allocator)
        self.assertIs(pool.allocator, plug._allocator)
        with TORCH.cuda.use_mem_pool(pool, device="cuda:0"):
            ps = [LIB.alloc(100000, 0, 0) for _ in range(4)]
        self.assertTrue(all(ps))
        self.assertEqual(pool.stats()["Devices"]["0"]["Segments"], 1)
        for p in ps:
            LIB.free(p, 100000, 0, 0)
        pool.close()
        pool.close()  # closing twice is harmless
        with self.assertRaises(ArenaplanError):
            POOLS.stats(pool.id[1])  # released: gone
        with self.assertRaises(RuntimeError):
            with TORCH.cuda.use_mem_pool(pool):
                pass

    def test_refusals(self):
        with self.assertRaisesRegex(RuntimeError, "CUDAPluggableAllocator made after"):
            TORCH.cuda.MemPool(types.SimpleNamespace())  # an allocator arenaplan cannot call
        with self.assertRaisesRegex(RuntimeError, "symmetric"):
            TORCH.cuda.MemPool(symmetric=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            TORCH.cuda.MemPool(use_on_oom=True)
        self.assertTrue(any("use_on_oom" in str(x.message) for x in w))
        with self.assertRaises(TypeError):
            with TORCH.cuda.use_mem_pool("not a pool"):
                pass

    def test_nesting_and_arenaplan_memory(self):
        alloc = RecordingAllocator()
        outer, inner = TORCH.cuda.MemPool(), self.pool_with(alloc)
        with TORCH.cuda.use_mem_pool(outer):
            a = LIB.alloc(4096, 0, 0)
            with TORCH.cuda.use_mem_pool(inner):
                b = LIB.alloc(4096, 0, 0)
                with self.assertRaises(ArenaplanError):
                    outer.close()  # a thread routes to it
            c = LIB.alloc(4096, 0, 0)
        self.assertTrue(alloc.holds(b))
        self.assertFalse(alloc.holds(a) or alloc.holds(c))
        names = {s["frames"][0]["name"] for s in outer.snapshot()}
        self.assertEqual(names, {f"MemPool {outer.id[1]}"})
        self.assertEqual(outer.stats()["Devices"]["0"]["Live"], 2)
        # The C fast path is shut while a thread routes to a pool (a freed
        # default block is not kept) and opens again afterwards.
        kept = lambda: LIB.stats(0)["FastPath"]["Kept"]  # noqa: E731
        d = LIB.alloc(12345, 0, 0x99)
        before = kept()
        with TORCH.cuda.use_mem_pool(outer):
            LIB.free(d, 12345, 0, 0x99)
        self.assertEqual(kept(), before, "a free was kept by the fast path during use_mem_pool")
        d = LIB.alloc(12345, 0, 0x99)
        LIB.free(d, 12345, 0, 0x99)
        self.assertEqual(kept(), before + 1, "the fast path did not reopen after use_mem_pool")
        for p in (a, b, c):
            LIB.free(p, 4096, 0, 0)
        outer.close()
        inner.close()
        self.assertEqual(alloc.live, {})


if __name__ == "__main__":
    unittest.main()
