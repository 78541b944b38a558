"""Misuse of arenaplan.torch, each refused with a clear error, and the
paused state that the library owns and replays obey; on the simulated
device with test_torch_flow's stand-in for torch."""
import ctypes
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import test_torch_flow as flow  # noqa: E402  (installs the stand-in for torch)

ap, LIB = flow.ap, flow.LIB
ap_state = flow.ap_state


class MisuseTest(unittest.TestCase):
    def test_replay_after_close(self):
        g = ap.graph(flow.model(), warmup=1)
        g.close()
        with self.assertRaisesRegex(ap.ArenaplanError, "closed graph"):
            g.replay()
        fam = ap.graphs({2: flow.model(scale=2), 1: flow.model()}, warmup=1)
        fam.replay(1)
        fam.close()
        with self.assertRaisesRegex(ap.ArenaplanError, "closed graph family"):
            fam.replay(1)

    def test_second_install(self):
        ap.install()  # no library named: what is installed stays
        ap.install(LIB.path)  # the same library: a no-op
        self.assertIs(ap_state.lib, LIB)
        with self.assertRaisesRegex(ap.ArenaplanError, "installed already"):
            ap.install(os.path.join(os.path.dirname(LIB.path), "another", "libarenaplan.so"))
        self.assertIs(ap_state.lib, LIB)

    def test_family_keys_that_collide_as_names(self):
        runs = []

        def step():
            runs.append(1)
            return flow.model()()
        with self.assertRaisesRegex(ValueError, r"keys 1 and '1' have one name"):
            ap.graphs({1: step, "1": step})
        self.assertEqual(runs, [], "the family ran its members before refusing their keys")

    def test_budgets(self):
        for bad, err, word in ((math.nan, ValueError, "finite"), (math.inf, ValueError, "finite"),
                               (-1.0, ValueError, "negative"), (1e12, ValueError, "most allowed"),
                               (True, TypeError, "number"), ("1", TypeError, "number")):
            for make in (lambda b: ap.graph(flow.model(), budget=b), lambda b: ap.graphs({1: flow.model()}, budget=b),
                         lambda b: ap.eager(flow.model(), budget=b)):
                with self.subTest(budget=bad):
                    with self.assertRaisesRegex(err, word):
                        make(bad)
        # The library refuses them too, for callers other than this package.
        sid = LIB.step_new(0, "budget")
        h = flow._state.stream.cuda_stream
        LIB.step_record(sid, h)
        flow.model()()
        LIB.step_end(sid)
        for bad, word in ((math.nan, "finite"), (-math.inf, "finite"), (-2.0, "negative"), (1e300, "more than")):
            with self.assertRaisesRegex(ap.ArenaplanError, word):
                LIB.step_plan(sid, bad)
        LIB.step_plan(sid, 0.5)
        LIB.step_close(sid)


class PausedTest(unittest.TestCase):
    def tearDown(self):
        for dev in (0, 1):
            if LIB.paused(dev):
                LIB.resume(dev, [])

    def test_pause_everything_refuses_replays(self):
        g = ap.graph(flow.model(), warmup=1)
        fam = ap.graphs({2: flow.model(scale=2), 1: flow.model()}, warmup=1)
        g.replay()
        self.assertFalse(ap.paused())
        gen = LIB._pause_gen.value
        ap.pause()
        self.assertNotEqual(LIB._pause_gen.value, gen, "a pause left the pause generation as it was")
        self.assertTrue(ap.paused())
        self.assertIn("graphs", ap.paused_tags())
        with self.assertRaisesRegex(ap.ArenaplanError, "paused"):
            g.replay()
        with self.assertRaisesRegex(ap.ArenaplanError, "paused"):
            fam.replay(1)
        # Another device's graphs are not paused.
        self.assertFalse(ap.paused(device=1))
        self.assertFalse(LIB.graphs_paused(1))
        ap.resume()
        self.assertFalse(ap.paused())
        g.replay()
        fam.replay(2)
        g.close()
        fam.close()

    def test_pause_through_the_library_is_seen(self):
        g = ap.graph(flow.model(), warmup=1)
        g.replay()  # the answer cached
        LIB.pause(0, ["graphs"])  # not through arenaplan.torch
        with self.assertRaisesRegex(ap.ArenaplanError, "paused"):
            g.replay()
        LIB.resume(0, ["graphs"])
        g.replay()
        g.close()

    def test_region_pause_leaves_graphs(self):
        with ap.region("kv"):
            p = LIB.alloc(4096, 0, flow._state.stream.cuda_stream)
        ap.pause("kv")
        self.assertTrue(ap.paused("kv"))
        self.assertFalse(ap.paused())
        self.assertEqual(ap.paused_tags(), frozenset({"kv"}))
        ap.resume("kv")
        LIB.free(p)

    def test_paused_null_out(self):
        err = LIB._lib.arenaplan_paused(0, None)
        msg = LIB._take(err)
        self.assertIsNotNone(msg, "arenaplan_paused accepted a NULL out-pointer")
        self.assertIn("NULL", msg)

    def test_generation_symbol(self):
        self.assertIsInstance(ctypes.c_uint64.in_dll(LIB._lib, "arenaplan_pause_generation").value, int)


if __name__ == "__main__":
    unittest.main()
