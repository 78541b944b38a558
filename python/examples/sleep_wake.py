"""A batch-size family in one arena, and sleep/wake that keeps every address.

    python3 examples/sleep_wake.py
"""
import torch

import arenaplan.torch as ap

ap.install()

with ap.region("weights", backup=True):  # kept in page-locked host memory while paused
    model = torch.nn.Linear(2048, 2048).cuda()
with ap.region("kv"):  # dropped while paused, refilled after
    cache = torch.zeros(64, 2048, device="cuda")

with torch.no_grad():
    fam = ap.graphs({b: (lambda b=b: model(cache[:b])) for b in (64, 16, 4, 1)})  # largest first
    before = fam.replay(16).clone()
    ap.pause()   # weights, KV cache and graphs: device memory back to the driver
    assert ap.paused()
    ap.resume()  # mapped again at the same addresses, weights restored
    cache.zero_()
    assert torch.equal(fam.replay(16), before)
print(fam.report()["ratio"], "x the largest member's lower bound; sleep/wake kept the graphs")
fam.close()
