"""Tensor-parallel ranks through the C ABI on the simulated device: each
rank a process (the library reads RANK and WORLD_SIZE once), plans saved on
one rank's device 1, loaded or refused by others. Run as test_lib.py."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

RANK_PROGRAM = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from arenaplan._lib import ArenaplanError, Library
    lib, dev, what, path = Library(), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    stream = 0x301

    def run():
        acts = []
        for i in range(5):
            acts.append(lib.alloc(4096 * (i + 1), dev, stream))
            ws = lib.alloc(65536, dev, stream)
            lib.free(ws, 65536, dev, stream)
            if len(acts) > 2:
                lib.free(acts.pop(0), 0, dev, stream)
        out = lib.alloc(8192, dev, stream)
        for a in acts:
            lib.free(a, 0, dev, stream)
        return out

    other = 1 - dev
    weights = lib.alloc(1 << 20, other, 0)  # the other device holds memory throughout
    before = lib.stats(other)
    sid = lib.step_new(dev, "tp")
    res = {}
    try:
        if what == "save":
            lib.step_record(sid, stream)
            out = run()
            lib.step_end(sid)
            lib.free(out, 0, dev, stream)
            lib.step_plan(sid, 1.0)
            lib.step_save(sid, path)
        else:
            lib.step_load(sid, path)
        lib.step_serve(sid, stream, True)
        out = run()
        lib.step_end(sid)
        lib.free(out, 0, dev, stream)
        res["report"] = lib.step_report(sid)
    except ArenaplanError as e:
        res["error"], res["error_type"] = str(e), type(e).__name__
    res["other_unchanged"] = lib.stats(other) == before
    res["this"] = lib.stats(dev)["ArenaBytes"]
    print(json.dumps(res))
""")


def rank_process(rank, world, device, what, path):
    env = dict(os.environ, ARENAPLAN_DEVICE="sim", RANK=str(rank), WORLD_SIZE=str(world))
    p = subprocess.run([sys.executable, "-c", RANK_PROGRAM, os.path.join(HERE, ".."), str(device), what, path],
                       env=env, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"rank {rank} of {world}: exit {p.returncode}: {p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


class RankTest(unittest.TestCase):
    def test_plan_per_rank(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rank1of2.plan")
            saved = rank_process(1, 2, 1, "save", path)
            self.assertNotIn("error", saved)
            self.assertTrue(saved["other_unchanged"], "a step on device 1 changed device 0's counters")
            self.assertEqual(saved["report"]["divergences"], 0)
            self.assertGreater(saved["this"], 0)
            # The same rank in another process, on device 0 this time.
            again = rank_process(1, 2, 0, "load", path)
            self.assertNotIn("error", again)
            self.assertEqual(again["report"]["divergences"], 0)
            self.assertTrue(again["other_unchanged"])
            for rank, world, want in [(0, 2, "made by rank 1 of 2; this process is rank 0 of 2"),
                                      (1, 4, "made by rank 1 of 2; this process is rank 1 of 4"),
                                      (0, 1, "made by rank 1 of 2; this process is rank 0 of 1")]:
                r = rank_process(rank, world, 1, "load", path)
                self.assertIn(want, r.get("error", ""), f"rank {rank} of {world}: {r}")
                self.assertIn(path, r["error"])
                self.assertEqual(r["error_type"], "PlanMismatchError")


if __name__ == "__main__":
    unittest.main()
