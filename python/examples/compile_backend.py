"""torch.compile's kernels captured on a planned arena: reduce-overhead's
graphs at the lower bound.

    python3 examples/compile_backend.py
"""
import torch

import arenaplan.torch as ap

ap.install()
import arenaplan.compile  # noqa: E402,F401  registers backend="arenaplan" (the entry point does too)

model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
f = torch.compile(model, backend="arenaplan")
x = torch.randn(32, 512, device="cuda")
with torch.no_grad():
    for _ in range(4):  # the first call compiles, the second captures, later ones replay
        out = f(x)
    assert torch.allclose(out, model(x), atol=1e-5)
print(arenaplan.compile.report())
