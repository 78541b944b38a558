#!/usr/bin/env python3
"""PyTorch twin of `run --plan FAMILY.plan` (plan --batch-sizes): the same
GPT-2-shaped decode step as bench/torch_decode.py, captured once per batch
size into CUDA graphs that share ONE memory pool (every capture after the
first passes pool=first_graph.pool()), as PyTorch recommends for graphs
replayed one at a time.

Weights are shared; the KV cache is allocated once for the largest batch,
[max_batch, heads, kv_len, head_dim], and the graph of batch B writes and
reads its first B rows (as our family members do). Both live outside the
pool, as our shared region lives outside the members' private buffers.

It reports the pool's reserved bytes (torch.cuda.memory_reserved after all
captures minus before, the cache emptied first), the bytes still allocated
in it after capture (every graph's static output stays alive so it can be
read after a replay), and for comparison the same captures with one pool
per graph. It also replays a mixed round-robin sequence of batch sizes and
checks each step's logits against eager execution of the same sequence.

    python3 bench/torch_family.py --batch-sizes 1,2,4,8,16,32,64 --json
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    for f in ["layers", "width", "heads", "kv-len", "vocab"]:
        ap.add_argument("--" + f, type=int, default=0)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.set_grad_enabled(False)

    L, W, H = args.layers or 12, args.width or 768, args.heads or 12
    T, V = args.kv_len or 1024, args.vocab or 50257
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    MB, hd = max(sizes), W // H
    g = torch.Generator(device=dev).manual_seed(1)

    def r(*shape, a=0.0346, c=0.0):
        return (torch.rand(*shape, device=dev, generator=g) * 2 - 1) * a + c

    wte, wpe = r(V, W), r(T, W, a=0.0173)
    layers = []
    for _ in range(L):
        layers.append(dict(
            ln1=(r(W, a=0.1, c=1), r(W, a=0.05)), wqkv=r(3 * W, W), bqkv=r(3 * W, a=0.01),
            wo=r(W, W, a=0.007), bo=r(W, a=0.01),
            ln2=(r(W, a=0.1, c=1), r(W, a=0.05)), wfc=r(4 * W, W), bfc=r(4 * W, a=0.01),
            wpr=r(W, 4 * W, a=0.007), bpr=r(W, a=0.01),
            kc=r(MB, H, T, hd, a=1.0), vc=r(MB, H, T, hd, a=1.0)))
    lnf = (r(W, a=0.1, c=1), r(W, a=0.05))
    kv0 = [(p["kc"].clone(), p["vc"].clone()) for p in layers]
    ar = torch.arange(T, device=dev)
    pos = torch.zeros(1, device=dev, dtype=torch.long)
    nsteps = max(args.steps + args.warmup, 64)
    pos_all = torch.tensor([(T * 7 // 8 + s) % T for s in range(nsteps)], device=dev, dtype=torch.long)
    toks = {B: torch.zeros(B, device=dev, dtype=torch.long) for B in sizes}
    tok_all = {B: torch.randint(0, V, (nsteps, B), device=dev, generator=g) for B in sizes}

    def feed(B, s):
        pos.copy_(pos_all[s % nsteps:s % nsteps + 1])
        toks[B].copy_(tok_all[B][s % nsteps])

    def reset_kv():
        for p, (k, v) in zip(layers, kv0):
            p["kc"].copy_(k)
            p["vc"].copy_(v)

    def make_step(B):
        tok = toks[B]

        def step():
            x = wte[tok] + wpe[pos]
            mask = (ar <= pos).view(1, 1, 1, T)
            for p in layers:
                kc, vc = p["kc"][:B], p["vc"][:B]
                h = F.layer_norm(x, (W,), p["ln1"][0], p["ln1"][1], 1e-5)
                qkv = F.linear(h, p["wqkv"], p["bqkv"]).view(B, 3, H, hd)
                q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
                kc.index_copy_(2, pos, k.unsqueeze(2))
                vc.index_copy_(2, pos, v.unsqueeze(2))
                a = F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, attn_mask=mask)
                x = x + F.linear(a.reshape(B, W), p["wo"], p["bo"])
                h = F.layer_norm(x, (W,), p["ln2"][0], p["ln2"][1], 1e-5)
                h = F.gelu(F.linear(h, p["wfc"], p["bfc"]), approximate="tanh")
                x = x + F.linear(h, p["wpr"], p["bpr"])
            x = F.layer_norm(x, (W,), lnf[0], lnf[1], 1e-5)
            return F.linear(x, wte)
        return step

    steps = {B: make_step(B) for B in sizes}
    seq = [sizes[i % len(sizes)] for i in range(2 * len(sizes))]

    # Eager mixed sequence, for the replay check.
    reset_kv()
    eager = []
    for i, B in enumerate(seq):
        feed(B, i)
        eager.append(steps[B]().clone())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for B in sizes:
            for s in range(2):
                feed(B, s)
                steps[B]()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def capture_all(shared):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        res0, alloc0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        graphs, outs, first = {}, {}, None
        t0 = time.perf_counter()
        for B in sizes:
            gr = torch.cuda.CUDAGraph()
            pool = first.pool() if (shared and first is not None) else None
            with torch.cuda.graph(gr, pool=pool):
                outs[B] = steps[B]()
            graphs[B] = gr
            first = first or gr
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        return graphs, outs, torch.cuda.memory_reserved() - res0, torch.cuda.memory_allocated() - alloc0, ms

    # One pool per graph first (for comparison), then the shared pool.
    graphs, outs, sep_pool, sep_live, _ = capture_all(False)
    del graphs, outs
    graphs, outs, pool, live, capture_ms = capture_all(True)
    out_bytes = sum(o.numel() * o.element_size() for o in outs.values())

    # Mixed sequence replayed, each step's logits against eager.
    reset_kv()
    max_diff, equal = 0.0, True
    for i, B in enumerate(seq):
        feed(B, i)
        graphs[B].replay()
        d = (outs[B] - eager[i]).abs().max().item()
        max_diff = max(max_diff, d)
        equal = equal and torch.equal(outs[B], eager[i])

    members = []
    for B in sizes:
        for s in range(args.warmup):
            feed(B, s)
            graphs[B].replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(args.steps):
            feed(B, args.warmup + s)
            graphs[B].replay()
        torch.cuda.synchronize()
        members.append(dict(batch=B, replay_us_per_step=round((time.perf_counter() - t0) / args.steps * 1e6, 1)))

    kv_bytes = sum(p["kc"].numel() * 4 * 2 for p in layers)
    res = dict(framework="torch " + torch.__version__, device=torch.cuda.get_device_name(),
               workload="gpt2-decode family", shape=dict(layers=L, width=W, heads=H, kv_len=T, vocab=V),
               batch_sizes=sizes, dtype="fp32", kv_bytes=kv_bytes,
               shared_pool_reserved_bytes=pool, shared_pool_live_after_capture_bytes=live,
               static_outputs_bytes=out_bytes, shared_pool_beyond_outputs_bytes=pool - out_bytes,
               separate_pools_reserved_bytes=sep_pool, separate_pools_live_bytes=sep_live,
               capture_ms=round(capture_ms, 3), mixed_sequence_steps=len(seq),
               mixed_replay_equal_eager=equal, mixed_replay_max_abs_diff=max_diff, members=members)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:36s} {v}")


if __name__ == "__main__":
    main()
