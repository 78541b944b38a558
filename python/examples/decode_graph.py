"""A model's step captured once on a planned arena and replayed.

    python3 examples/decode_graph.py        # on a GPU, arenaplan installed (pip install ./python)
"""
import torch

import arenaplan.torch as ap

ap.install()  # before anything touches CUDA

model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda().half()
x = torch.randn(64, 1024, device="cuda", dtype=torch.half)  # a static input: copy new data into it

with torch.no_grad():
    step = ap.graph(lambda: model(x))  # warm-up, one run recorded, planned at the lower bound, one capture
    out = step.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, model(x)), "a replay computes what the eager step does"

r = step.report()
print(f"arena {r['arena']} B = {r['ratio']:.4f} x the lower bound {r['lower_bound']} B, "
      f"{r['divergences']} divergences, {r['captures']} capture(s)")
step.save("/tmp/decode.plan")  # a checked plan file: ap.graph(fn, plan=...) captures once from it
step.close()
