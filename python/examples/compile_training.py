"""A training loop with torch.compile on arenaplan's graphs: each compiled
graph's forward and backward captured as one chain in one arena planned on
their joint timeline; the loop itself unchanged.

    python3 examples/compile_training.py
"""
import copy

import torch

import arenaplan.torch as ap

ap.install()
import arenaplan.compile  # noqa: E402  registers backend="arenaplan" (the entry point does too)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
twin = copy.deepcopy(model)  # trained eagerly, for comparison
x, y = torch.randn(64, 512, device="cuda"), torch.randn(64, 512, device="cuda")
f = torch.compile(model, backend="arenaplan")
opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, twin)]
for step in range(6):  # the first step runs plain, the second captures, later ones replay
    losses = []
    for net, opt in ((f, opts[0]), (twin, opts[1])):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[1]), losses
for r in arenaplan.compile.report():
    print(r["graph"], r.get("training"), "captured" if r["captured"] else r["reason"],
          "arena", r.get("arena"), "lower bound", r.get("lower_bound"), "replays", r["replays"])
