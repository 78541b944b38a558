"""torch.compile's CUDAGraph Trees refused at the call under arenaplan (no
torch needed: a stand-in records what reaches it)."""
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from arenaplan import _compat  # noqa: E402


def fake_torch(graphs=False):
    calls = []

    def compile(model=None, **kwargs):
        calls.append(kwargs)
        return model

    cfg = types.SimpleNamespace(triton=types.SimpleNamespace(cudagraphs=graphs))
    t = types.SimpleNamespace(compile=compile, _inductor=types.SimpleNamespace(config=cfg))
    return t, calls


class CompatTest(unittest.TestCase):
    def tearDown(self):
        _compat._route[0] = _compat.ROUTE

    def test_graph_modes_routed_to_arenaplan(self):
        torch, calls = fake_torch()
        registered = []
        _compat.install(torch, register=lambda: registered.append(1))
        _compat.install(torch)  # wrapped once
        cases = [({"mode": "reduce-overhead"}, {"from_mode": "reduce-overhead"}),
                 ({"mode": "max-autotune", "fullgraph": True}, {"from_mode": "max-autotune"}),
                 ({"options": {"triton.cudagraphs": True, "max_autotune": True}},
                  {"max_autotune": True, "from_mode": 'options={"triton.cudagraphs": True}'}),
                 ({"mode": "reduce-overhead", "dynamic": False}, {"from_mode": "reduce-overhead"})]
        for kwargs, options in cases:
            self.assertEqual(torch.compile("model", **kwargs), "model")
            got = calls[-1]
            self.assertEqual(got["backend"], "arenaplan")
            self.assertNotIn("mode", got, "torch.compile takes a mode or options, not both")
            self.assertEqual(got["options"], options)
            for k in ("fullgraph", "dynamic"):
                self.assertEqual(got.get(k), kwargs.get(k), "the other arguments are passed on")
        self.assertEqual(len(calls), len(cases))
        self.assertEqual(len(registered), len(cases), "the backend is registered before each routed call")

    def test_global_config_routed(self):
        torch, calls = fake_torch(graphs=True)
        _compat.install(torch)
        torch.compile("model")
        self.assertEqual(calls[-1]["options"]["from_mode"], "torch._inductor.config.triton.cudagraphs = True")

    def test_bad_route_raises(self):
        torch, _ = fake_torch()
        with self.assertRaises(ValueError):
            _compat.install(torch, route="maybe")

    def test_graph_modes_refused_at_the_call(self):
        torch, calls = fake_torch()
        _compat.install(torch, route=_compat.REFUSE)
        _compat.install(torch, route=_compat.REFUSE)  # idempotent: wrapped once
        for kwargs in ({"mode": "reduce-overhead"}, {"mode": "max-autotune"},
                       {"options": {"triton.cudagraphs": True}}):
            with self.assertRaises(_compat.CUDAGraphTreesError) as e:
                torch.compile("model", **kwargs)
            self.assertIn('backend="arenaplan"', str(e.exception))
            self.assertIsInstance(e.exception, RuntimeError)
        self.assertEqual(calls, [])

    def test_other_uses_pass_through(self):
        torch, calls = fake_torch()
        _compat.install(torch)
        cases = ({}, {"mode": "max-autotune-no-cudagraphs"}, {"backend": "arenaplan"},
                 {"backend": "arenaplan", "mode": "reduce-overhead"}, {"mode": "default"})
        for kwargs in cases:
            self.assertEqual(torch.compile("model", **kwargs), "model")
        self.assertEqual(calls, list(cases), "passed on unchanged")

    def test_global_config_refused(self):
        torch, _ = fake_torch(graphs=True)
        _compat.install(torch, route=_compat.REFUSE)
        with self.assertRaises(_compat.CUDAGraphTreesError):
            torch.compile("model")


if __name__ == "__main__":
    unittest.main()
