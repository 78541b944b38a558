#!/usr/bin/env python3
"""A snapshot of an arenaplan process for PyTorch's memory_viz: GPT-2
small's decode step (batch 8, KV cache 1024, fp32, random weights; the
step of bench/torch_decode.py) captured on a planned arena, replayed, with
eager work beside it on the spill, history recorded throughout.

    python3 bench/torch_snapshot.py OUT.pickle
    scripts/memory-viz-png.sh OUT.pickle docs/img/memory-viz-decode   # where Chromium is

The dump is taken between replays, so the arena segment shows its planned
buffers (``arenaplan_planned_blocks``) with none live, and the spill
segments the weights, the KV cache and the eager tensors.
"""
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/decode-snapshot.pickle"
    import arenaplan.torch as ap
    ap.install()
    import torch
    import torch_decode
    dev = torch.device("cuda", 0)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    args = types.SimpleNamespace(layers=0, width=0, heads=0, kv_len=0, batch=8, vocab=0, steps=8, warmup=3)
    shape, feed, step, _ = torch_decode.gpt2(args, dev)
    with torch.no_grad():
        feed(0)
        g = ap.graph(lambda: step("sdpa"), warmup=3)
        for s in range(1, 5):
            feed(s)
            g.replay()
            logits = g.outputs.clone()  # eager work beside the graph: on the spill
            top = logits.topk(5, dim=-1)
            del logits, top
        torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(out)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(out, os.path.getsize(out), "bytes;", g.report().get("arena"), "arena bytes")


if __name__ == "__main__":
    main()
