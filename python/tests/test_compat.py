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
    def test_graph_modes_refused_at_the_call(self):
        torch, calls = fake_torch()
        _compat.install(torch)
        _compat.install(torch)  # idempotent: wrapped once
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
        for kwargs in ({}, {"mode": "max-autotune-no-cudagraphs"}, {"backend": "arenaplan"},
                       {"backend": "arenaplan", "mode": "reduce-overhead"}, {"mode": "default"}):
            self.assertEqual(torch.compile("model", **kwargs), "model")
        self.assertEqual(len(calls), 5)

    def test_global_config(self):
        torch, _ = fake_torch(graphs=True)
        _compat.install(torch)
        with self.assertRaises(_compat.CUDAGraphTreesError):
            torch.compile("model")


if __name__ == "__main__":
    unittest.main()
