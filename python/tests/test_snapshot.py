"""Snapshots and history in PyTorch's schema, on the simulated device (no
GPU, no torch): our snapshot's keys and value types against real
torch.cuda.memory._snapshot() pickles (../shared/data/torch), and a
recorded step's history read back by `plan` at the step's lower bound.

    scripts/build-torch-bridge.sh
    ARENAPLAN_LIB=.dev/torch/libarenaplan.so python3 -m unittest discover -s python/tests -v

ARENAPLAN_SNAPSHOT_FIXTURE=DIR also writes the dumped snapshot and the
step's lower bound there (lifetime/testdata holds them for Go's test).
"""
import glob
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

os.environ["ARENAPLAN_DEVICE"] = "sim"  # read once, when the library loads
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from arenaplan import _snapshot as snap  # noqa: E402
from arenaplan._lib import Library  # noqa: E402

LIB = Library()
REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "..", "shared", "data", "torch")
STREAM = 0x3301


def run_step(stream, layers=6):
    """Activations freed two layers later, a workspace and a 0-byte
    request per layer; returns the output, kept."""
    acts = []
    for i in range(layers):
        a = LIB.alloc(4096 + 1000 * i, 0, stream)
        acts.append(a)
        ws = LIB.alloc(65536, 0, stream)
        z = LIB.alloc(0, 0, stream)
        LIB.free(ws, 65536, 0, stream)
        LIB.free(z, 0, 0, stream)
        if len(acts) > 2:
            LIB.free(acts.pop(0))
    out = LIB.alloc(8192, 0, stream)
    for a in acts:
        LIB.free(a)
    return out


def fake_torch(device_count=1):
    """The parts of torch that install touches."""
    c = types.SimpleNamespace(_cuda_memorySnapshot=None, _cuda_record_memory_history=None,
                              _cuda_record_memory_history_legacy=None)
    return types.SimpleNamespace(_C=c, cuda=types.SimpleNamespace(device_count=lambda: device_count))


def plan_lower_bound(data):
    """The lower bound `plan` reads from a pickled snapshot."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "snap.pickle")
        with open(p, "wb") as f:
            f.write(data)
        r = subprocess.run(["go", "run", "./cmd/plan", "--json", "--align", "256", p], cwd=REPO,
                           capture_output=True, text=True, env=dict(os.environ, CGO_ENABLED="0"))
        if r.returncode != 0:
            raise AssertionError(f"plan failed: {r.stderr}")
        return json.loads(r.stdout.strip().splitlines()[0])["lower_bound"]


def real_snapshots():
    return sorted(glob.glob(os.path.join(DATA, "*.pickle")))


class SnapshotSchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.torch = fake_torch()
        snap.install(LIB, cls.torch)
        C = cls.torch._C
        C._cuda_record_memory_history("all", "all", "all", sys.maxsize, True, False, False, [])
        sid = LIB.step_new(0, "schema")
        LIB.step_record(sid, STREAM)
        out = run_step(STREAM)
        LIB.step_end(sid)
        LIB.free(out)
        LIB.step_plan(sid, 1.0)
        LIB.step_serve(sid, STREAM, True)
        cls.out = run_step(STREAM)  # kept: an active planned block
        LIB.step_end(sid)
        cls.served = C._cuda_memorySnapshot(None)  # the step's two runs
        cls.spilled = LIB.alloc(123456, 0, 0x3302)
        cls.snapshot = C._cuda_memorySnapshot(None)
        cls.report = LIB.step_report(sid)
        C._cuda_record_memory_history(None)
        LIB.free(cls.out)
        cls.idle = C._cuda_memorySnapshot(None)  # no planned buffer live
        LIB.free(cls.spilled)
        LIB.step_close(sid)

    def test_against_real_snapshot(self):
        files = real_snapshots()
        if not files:
            self.skipTest(f"no PyTorch snapshots in {DATA} (../shared/data is absent)")
        real = []
        for f in files:
            with open(f, "rb") as fh:
                real.append(pickle.load(fh))
        ours = self.snapshot

        def types_of(dicts):
            t = {}
            for d in dicts:
                for k, v in d.items():
                    t.setdefault(k, set()).add(type(v))
            return t

        self.assertEqual(set(ours), set(real[0]), "top-level keys")
        for r in real:
            self.assertEqual(set(r), set(real[0]))
        r_segs = [s for r in real for s in r["segments"]]
        r_blocks = [b for s in r_segs for b in s["blocks"]]
        r_trace = [e for r in real for d in r["device_traces"] for e in d]
        r_frames = [f for e in r_trace for f in e.get("frames", [])]
        o_segs = ours["segments"]
        o_blocks = [b for s in o_segs for b in s["blocks"] + s.get(snap.PLANNED_BLOCKS, [])]
        o_trace = [e for d in ours["device_traces"] for e in d]
        o_frames = [f for x in o_trace + o_blocks + o_segs for f in x["frames"]]
        self.assertTrue(o_segs and o_blocks and o_trace and o_frames, "our snapshot is missing a part")
        for what, theirs, mine in [("segment", r_segs, o_segs), ("block", r_blocks, o_blocks),
                                   ("trace entry", r_trace, o_trace), ("frame", r_frames, o_frames)]:
            want, got = types_of(theirs), types_of(mine)
            required = set.intersection(*(set(x) for x in theirs))
            for x in mine:
                missing = required - set(x)
                self.assertFalse(missing, f"{what} {x} lacks {missing}")
                extra = set(x) - set(want) - ({snap.PLANNED_BLOCKS} if what == "segment" else set())
                self.assertFalse(extra, f"{what} has keys PyTorch's has not: {extra}")
            for k, ts in got.items():
                if k in want:
                    self.assertTrue(ts <= want[k], f"{what} key {k!r}: {ts} where PyTorch has {want[k]}")
        self.assertEqual(types_of([ours["allocator_settings"]]).keys(),
                         types_of([r["allocator_settings"] for r in real]).keys())
        for s in o_segs:
            self.assertEqual(len(s["segment_pool_id"]), 2)
        states = {b["state"] for b in r_blocks} | {"active_pending_free"}
        self.assertTrue({b["state"] for b in o_blocks} <= states)
        actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                   "segment_unmap", "oom"}
        self.assertTrue({e["action"] for e in o_trace} <= actions)

    def test_arena_segment_and_blocks(self):
        segs = self.snapshot["segments"]
        arenas = [s for s in segs if s["frames"] and s["frames"][0]["name"] == "step schema"]
        self.assertEqual(len(arenas), 1, segs)
        a = arenas[0]
        self.assertEqual(a["total_size"], self.report["arena"])
        planned = a[snap.PLANNED_BLOCKS]
        self.assertEqual(len(planned), self.report["buffers"])
        live = [b for b in a["blocks"] if b["state"] == "active_allocated"]
        self.assertEqual([(b["address"], b["requested_size"]) for b in live], [(self.out, 8192)])
        self.assertEqual([b for b in planned if b["state"] == "active_allocated"], live)
        self.assertEqual((a["allocated_size"], a["active_size"], a["requested_size"]),
                         (live[0]["size"], live[0]["size"], 8192))
        for b in planned:
            self.assertTrue(a["address"] <= b["address"] < a["address"] + a["total_size"])
            self.assertEqual(b["frames"][0]["filename"], "arenaplan step schema")
        self.assertEqual(live[0]["frames"][0]["filename"], "arenaplan step schema")
        spill = [b for s in segs for b in s["blocks"] if b["address"] == self.spilled]
        self.assertEqual([(b["state"], b["requested_size"]) for b in spill], [("active_allocated", 123456)])
        # memory_snapshot's form: (pool, pool, include_traces)
        C = self.torch._C
        self.assertEqual(C._cuda_memorySnapshot((0, 0, False))["device_traces"], [[]])

    def assert_tiled(self, snapshot):
        """Every segment's blocks in address order, end to end, adding up
        to its total_size (memory_viz lays them so), its counters theirs."""
        for s in snapshot["segments"]:
            at = s["address"]
            for b in s["blocks"]:
                self.assertEqual(b["address"], at, f"segment {s['address']:#x}: {s['blocks']}")
                self.assertGreater(b["size"], 0)
                at += b["size"]
            self.assertEqual(at, s["address"] + s["total_size"], f"segment {s['address']:#x}: {s['blocks']}")
            live = [b for b in s["blocks"] if b["state"] == "active_allocated"]
            self.assertEqual(s["allocated_size"], sum(b["size"] for b in live))
            self.assertEqual(s["requested_size"], sum(b["requested_size"] for b in live))

    def test_segments_tile(self):
        self.assert_tiled(self.served)  # the step's output live
        self.assert_tiled(self.snapshot)  # and a spilled allocation
        self.assert_tiled(self.idle)
        arenas = [s for s in self.idle["segments"] if s["frames"] and s["frames"][0]["name"] == "step schema"]
        self.assertEqual(len(arenas), 1)
        a = arenas[0]
        self.assertEqual([(b["address"], b["size"], b["state"]) for b in a["blocks"]],
                         [(a["address"], a["total_size"], "inactive")])
        self.assertEqual((a["allocated_size"], a["active_size"]), (0, 0))
        self.assertEqual(len(a[snap.PLANNED_BLOCKS]), self.report["buffers"])
        self.assertFalse([b for b in a[snap.PLANNED_BLOCKS] if b["state"] != "inactive"])

    def test_plan_reads_served_snapshot(self):
        """`plan` reads a snapshot with a served arena (its tiled blocks and
        planned-buffer list) back at the step's lower bound."""
        if shutil.which("go") is None or os.environ.get("ARENAPLAN_TEST_GO") == "0":
            self.skipTest("go is not on PATH: `plan` not run")
        self.assertEqual(plan_lower_bound(pickle.dumps(self.served)), self.report["lower_bound"])

    def test_history_controls(self):
        C = self.torch._C
        C._cuda_record_memory_history("all", "all", "all", 4, False, False, False, [])
        try:
            for _ in range(10):
                LIB.free(LIB.alloc(1000, 0, 0x3303))
            trace = C._cuda_memorySnapshot(None)["device_traces"][0]
            self.assertEqual(len(trace), 4)
            self.assertEqual(trace[-1]["action"], "free_completed")
        finally:
            C._cuda_record_memory_history(None)
        self.assertEqual(C._cuda_memorySnapshot(None)["device_traces"], [[]])
        C._cuda_record_memory_history_legacy(True, True, 3)
        LIB.free(LIB.alloc(1000, 0, 0x3303))
        LIB.free(LIB.alloc(1000, 0, 0x3303))
        self.assertEqual(len(C._cuda_memorySnapshot(None)["device_traces"][0]), 3)
        C._cuda_record_memory_history_legacy(False)
        with self.assertRaises(ValueError):
            C._cuda_record_memory_history("everything")


def allocate_here(size, stream):
    """An allocation made from a function of a known name."""
    return LIB.alloc(size, 0, stream)


class FramesTest(unittest.TestCase):
    """With history recorded with stacks, alloc entries and the live blocks
    they made carry the Python stack of the allocation; with stacks=None,
    none; a block allocated before recording has none (as in PyTorch)."""

    def test_python_frames(self):
        torch = fake_torch()
        snap.install(LIB, torch)
        C = torch._C
        before = LIB.alloc(3000, 0, 0x3310)
        C._cuda_record_memory_history("all", "all", "python", 1000, True, False, False, [])
        try:
            p = allocate_here(5000, 0x3310)
            q = allocate_here(2 << 20, 0x3310)  # a large segment of its own
            got = C._cuda_memorySnapshot(None)
        finally:
            C._cuda_record_memory_history(None)
        allocs = [e for e in got["device_traces"][0] if e["action"] == "alloc" and e["addr"] in (p, q)]
        self.assertEqual(len(allocs), 2)
        for e in allocs:
            names = [f["name"] for f in e["frames"]]
            self.assertEqual(names[:2], ["alloc", "allocate_here"], e["frames"][:3])
            self.assertIn("test_python_frames", names)
            self.assertTrue(all(isinstance(f["line"], int) and f["filename"] for f in e["frames"]))
        blocks = {b["address"]: b for s in got["segments"] for b in s["blocks"]}
        self.assertIn("allocate_here", [f["name"] for f in blocks[p]["frames"]])
        self.assertEqual(blocks[before]["frames"], [])
        types_ = {s["address"]: s["segment_type"] for s in got["segments"] if s["segment_pool_id"] == (0, 0)}
        seg_of = lambda a: max(x for x in types_ if x <= a)  # noqa: E731
        self.assertEqual(types_[seg_of(p)], "small")
        self.assertEqual(types_[seg_of(q)], "large")
        # stacks=None: history without frames.
        C._cuda_record_memory_history("all", "all", None, 1000, True, False, False, [])
        try:
            r = allocate_here(5000, 0x3310)
            got = C._cuda_memorySnapshot(None)
        finally:
            C._cuda_record_memory_history(None)
        e = [e for e in got["device_traces"][0] if e["action"] == "alloc" and e["addr"] == r]
        self.assertEqual(e[0]["frames"], [])
        for a, n in ((before, 3000), (p, 5000), (q, 2 << 20), (r, 5000)):
            LIB.free(a, n, 0, 0x3310)

    def test_first_segment_has_its_event(self):
        """Recording on a device that has mapped nothing yet: the first
        allocation's segment_alloc comes before its alloc."""
        torch = fake_torch(device_count=3)
        snap.install(LIB, torch)
        C = torch._C
        C._cuda_record_memory_history("all", "all", "all", 1000, True, False, False, [])
        try:
            p = LIB.alloc(4096, 2, 0x3320)  # device 2 opens now
            trace = C._cuda_memorySnapshot(None)["device_traces"][2]
        finally:
            C._cuda_record_memory_history(None)
        actions = [e["action"] for e in trace]
        self.assertEqual(actions[:2], ["segment_alloc", "alloc"], actions)
        LIB.free(p, 4096, 2, 0x3320)


class PlanReadsItBackTest(unittest.TestCase):
    def test_recorded_step_lower_bound(self):
        torch = fake_torch()
        snap.install(LIB, torch)
        C = torch._C
        sid = LIB.step_new(0, "readback")
        C._cuda_record_memory_history("all", "all", "all", sys.maxsize, True, False, False, [])
        try:
            LIB.step_record(sid, STREAM)
            out = run_step(STREAM, layers=8)
            LIB.step_end(sid)
            s = C._cuda_memorySnapshot(None)
        finally:
            C._cuda_record_memory_history(None)
        LIB.free(out)
        LIB.step_plan(sid, 1.0)
        lower = LIB.step_report(sid)["lower_bound"]
        LIB.step_close(sid)
        self.assertEqual(sum(e["action"] == "alloc" for e in s["device_traces"][0]), 8 * 2 + 1)
        data = pickle.dumps(s)  # as torch.cuda.memory._dump_snapshot writes it
        fixture = os.environ.get("ARENAPLAN_SNAPSHOT_FIXTURE")
        if fixture:
            with open(os.path.join(fixture, "arenaplan_snapshot.pickle"), "wb") as f:
                f.write(data)
            with open(os.path.join(fixture, "arenaplan_snapshot.json"), "w") as f:
                json.dump({"lower_bound": lower}, f)
                f.write("\n")
        if shutil.which("go") is None or os.environ.get("ARENAPLAN_TEST_GO") == "0":
            self.skipTest("go is not on PATH: `plan` not run (lifetime's Go test reads the committed fixture)")
        self.assertEqual(plan_lower_bound(data), lower)


if __name__ == "__main__":
    unittest.main()
