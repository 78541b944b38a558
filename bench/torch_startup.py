#!/usr/bin/env python3
"""Start-up of a batch-size family of CUDA graphs, as inference engines
capture them: arenaplan's ap.graphs (every member in one planned arena)
against PyTorch's torch.cuda.graph per size in one shared pool (vLLM's
way), one process each.

    python3 bench/torch_startup.py --mode torch
    python3 bench/torch_startup.py --mode ours

The step: a Qwen2.5-1.5B-shaped decode step (hidden 1536, 12 query heads
over 2 KV heads of 128, MLP 8960 with SiLU gating, RMSNorm, vocab 151936,
bf16, random weights), LAYERS layers, a static KV cache of --kv-len
positions at the largest batch, expanded per layer to the query heads
(the large buffers live three at a time across each layer boundary). Sizes
64, 48, 32, 24, 16, 8, 4, 2, 1, largest first. Both modes: two warm-up runs
per size on the capture stream, then the capture(s); the time from the
first warm-up to the last graph ready, per size. Prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

SIZES = (64, 48, 32, 24, 16, 8, 4, 2, 1)


def build(torch, dev, layers, kv_len):
    F = torch.nn.functional
    W, H, KV, D, M, V = 1536, 12, 2, 128, 8960, 151936
    g = torch.Generator(device=dev).manual_seed(0)
    dt = torch.bfloat16

    def r(*shape, a=0.02):
        return ((torch.rand(*shape, device=dev, generator=g) * 2 - 1) * a).to(dt)

    emb, head = r(V, W), r(V, W)
    ls = [dict(n1=r(W, a=1.0), wq=r(H * D, W), wk=r(KV * D, W), wv=r(KV * D, W), wo=r(W, H * D),
               n2=r(W, a=1.0), wg=r(M, W), wu=r(M, W), wd=r(W, M),
               kc=r(SIZES[0], KV, kv_len, D, a=1.0), vc=r(SIZES[0], KV, kv_len, D, a=1.0)) for _ in range(layers)]
    nf = r(W, a=1.0)
    tok = torch.zeros(SIZES[0], dtype=torch.long, device=dev)
    pos = torch.full((1,), kv_len * 3 // 4, dtype=torch.long, device=dev)
    ar = torch.arange(kv_len, device=dev)

    def rms(x, w):
        return F.rms_norm(x, (W,), w, 1e-6)

    def step(B):
        def run():
            x = emb[tok[:B]]
            mask = (ar <= pos).view(1, 1, 1, kv_len)
            for p in ls:
                h = rms(x, p["n1"])
                q = F.linear(h, p["wq"]).view(B, H, 1, D)
                k = F.linear(h, p["wk"]).view(B, KV, 1, D)
                v = F.linear(h, p["wv"]).view(B, KV, 1, D)
                p["kc"][:B].index_copy_(2, pos, k)
                p["vc"][:B].index_copy_(2, pos, v)
                kf = p["kc"][:B].repeat_interleave(H // KV, dim=1)
                vf = p["vc"][:B].repeat_interleave(H // KV, dim=1)
                a = F.scaled_dot_product_attention(q, kf, vf, attn_mask=mask)
                x = x + F.linear(a.reshape(B, H * D), p["wo"])
                h = rms(x, p["n2"])
                x = x + F.linear(F.silu(F.linear(h, p["wg"])) * F.linear(h, p["wu"]), p["wd"])
            return F.linear(rms(x, nf), head)
        return run
    return {B: step(B) for B in SIZES}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["torch", "ours"], required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-len", type=int, default=1024)
    a = p.parse_args()
    import torch
    if a.mode == "ours":
        import arenaplan.torch as ap
        ap.install()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    fns = build(torch, dev, a.layers, a.kv_len)
    with torch.no_grad():
        fns[SIZES[-1]]()  # cuBLAS's handle and the kernels' first loads, before anything is timed
        torch.cuda.synchronize()
        res = {"mode": a.mode, "gpu": torch.cuda.get_device_name(0), "layers": a.layers, "kv_len": a.kv_len,
               "sizes": list(SIZES)}
        s = torch.cuda.Stream()
        r0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        if a.mode == "torch":
            graphs, outs, pool = {}, {}, None
            warm_ms, cap_ms = [], []
            for B, fn in fns.items():
                t = time.perf_counter()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        fn()
                torch.cuda.current_stream().wait_stream(s)
                t1 = time.perf_counter()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=s):
                    outs[B] = fn()
                pool = pool or g.pool()
                graphs[B] = g
                warm_ms.append((t1 - t) * 1e3)
                cap_ms.append((time.perf_counter() - t1) * 1e3)
            torch.cuda.synchronize()
            # host time of each size's warm-up runs and capture (no waits added)
            res["warmup_ms"] = [round(v, 1) for v in warm_ms]
            res["capture_ms"] = round(sum(cap_ms), 1)
            res["startup_ms"] = (time.perf_counter() - t0) * 1e3
            res["graph_bytes"] = torch.cuda.memory_reserved() - r0
        else:
            fam = ap.graphs(fns, warmup=2, stream=s)
            torch.cuda.synchronize()
            res["startup_ms"] = (time.perf_counter() - t0) * 1e3
            rep = fam.report()
            res["graph_bytes"] = rep["graph_bytes"]
            res["arena"], res["lower_bound"] = rep["arena"], rep["lower_bound"]
            res["plan_ms"] = rep["plan_build_ms"]
            res["setup_ms"] = round(rep["setup_ms"], 1)
            res["warmup_ms"] = [round(v, 1) for v in rep["warmup_ms"].values()]
            res["record_ms"] = sum(rep["record_ms"].values())
            res["capture_ms"] = sum(rep["capture_ms"].values())
            res["capture_parts_ms"] = rep["capture_parts_ms"]
            sp = ap.stats()["Spill"]
            res["spill"] = {k: sp[k] for k in ("Grows", "Unmaps", "Syncs", "PeakMapped")}
        res["per_size_ms"] = res["startup_ms"] / len(SIZES)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
