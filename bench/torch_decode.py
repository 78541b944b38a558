#!/usr/bin/env python3
"""PyTorch twin of arenaplan's built-in workloads, for side-by-side timing.

Same shapes and dtype (fp32) as `run --workload gpt2-decode|mlp`: the same
layers, fused where PyTorch's functional API allows, random weights. It
times eager steps and torch.cuda.graph replays of one step, and reports the
size of the graph's private memory pool (memory_reserved after capture
minus before, with the cache emptied first), i.e. what PyTorch's caching
allocator holds for the step's intermediates.

gpt2-decode: per step the token and position inputs are copied into static
tensors from device tensors staged for every step (as `run` does), the
current K/V are written into a static cache [B, H, kv_len, hd] at pos with
index_copy_, and attention runs over the whole cache with a mask t <= pos
(the static shapes a captured graph needs). Positions start at 7/8 of the
cache, as `run`'s do.

Attention (--attention): each scaled_dot_product_attention backend
(flash, efficient = memory-efficient, math, cudnn; "sdpa" = whatever the
dispatcher picks) or "plain" (q.K^T, masked softmax, .V as three ops).
The default, "auto", tries every one of them on the shape (eager warm-up,
capture, timed replays), keeps the fastest replay, and reports all trials
(a backend that refuses the shape, as flash and cuDNN do fp32, is listed
with its error).

--floor adds the floor of the step: the bytes `run`'s step must move (every
weight read once and the KV cache rows 0..pos read, averaged over the
positions of `run`'s --steps timed steps) and the median time of a
device-to-device copy of that many bytes (copy_us). The copy reads and
writes every byte, so the copy rate is 2*bytes/copy_us and the floor (the
bytes at that rate) is copy_us/2.

    python3 bench/torch_decode.py --workload gpt2-decode --batch 1 --floor --json
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

ATTENTION = ["sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-cudnn", "sdpa", "plain"]


def attend(kind, q, kc, vc, mask, scale):
    """One decode step's attention of q [B, H, 1, hd] over the whole cache
    [B, H, T, hd] with mask [1, 1, 1, T] (True: attend), by `kind`."""
    if kind == "plain":
        s = torch.matmul(q, kc.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), vc)
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
               "sdpa-math": SDPBackend.MATH, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}[kind]
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)


def gpt2(args, dev):
    L, W, H, T, B, V = args.layers or 12, args.width or 768, args.heads or 12, args.kv_len or 1024, args.batch or 1, args.vocab or 50257
    hd = W // H
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
            kc=r(B, H, T, hd, a=1.0), vc=r(B, H, T, hd, a=1.0)))
    lnf = (r(W, a=0.1, c=1), r(W, a=0.05))
    steps = args.steps + args.warmup
    pos_all = torch.tensor([(T * 7 // 8 + s) % T for s in range(steps)], device=dev, dtype=torch.long)
    tok_all = torch.randint(0, V, (steps, B), device=dev, generator=g)
    pos = torch.zeros(1, device=dev, dtype=torch.long)
    tok = torch.zeros(B, device=dev, dtype=torch.long)
    ar = torch.arange(T, device=dev)

    def feed(s):
        pos.copy_(pos_all[s:s + 1])
        tok.copy_(tok_all[s])

    scale = 1 / hd ** 0.5

    def step(kind):
        x = wte[tok] + wpe[pos]
        mask = (ar <= pos).view(1, 1, 1, T)
        for p in layers:
            h = F.layer_norm(x, (W,), p["ln1"][0], p["ln1"][1], 1e-5)
            qkv = F.linear(h, p["wqkv"], p["bqkv"]).view(B, 3, H, hd)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            p["kc"].index_copy_(2, pos, k.unsqueeze(2))
            p["vc"].index_copy_(2, pos, v.unsqueeze(2))
            a = attend(kind, q.unsqueeze(2), p["kc"], p["vc"], mask, scale)
            x = x + F.linear(a.reshape(B, W), p["wo"], p["bo"])
            h = F.layer_norm(x, (W,), p["ln2"][0], p["ln2"][1], 1e-5)
            h = F.gelu(F.linear(h, p["wfc"], p["bfc"]), approximate="tanh")
            x = x + F.linear(h, p["wpr"], p["bpr"])
        x = F.layer_norm(x, (W,), lnf[0], lnf[1], 1e-5)
        return F.linear(x, wte)

    shape = dict(layers=L, width=W, heads=H, kv_len=T, batch=B, vocab=V)
    # The floor's bytes: every weight read once (of wpe the one row), the
    # KV cache rows 0..pos of every layer read, averaged over the positions
    # of run's timed steps (0..steps-1 from 7/8 of the cache).
    per_layer = 2 * W + 3 * W * W + 3 * W + W * W + W + 2 * W + 4 * W * W + 4 * W + 4 * W * W + W
    weights = 4 * (V * W + W + L * per_layer + 2 * W)
    rows = sum((T * 7 // 8 + s) % T + 1 for s in range(args.steps)) / args.steps
    kv = 4 * L * 2 * B * rows * W
    return shape, feed, step, dict(weight_bytes=weights, kv_bytes=int(kv), mean_pos=rows - 1)



def mlp(args, dev):
    L, W, B = args.layers or 64, args.width or 256, args.batch or 1
    g = torch.Generator(device=dev).manual_seed(1)
    a = (6.5 / W) ** 0.5
    ws = [((torch.rand(W, W, device=dev, generator=g) * 2 - 1) * a, (torch.rand(W, device=dev, generator=g) * 2 - 1) * 0.1) for _ in range(L)]
    x0 = torch.rand(B, W, device=dev, generator=g) * 2 - 1

    def step(kind):
        x = x0
        for w, b in ws:
            x = F.gelu(F.linear(x, w, b), approximate="tanh")
        return x

    return dict(layers=L, width=W, batch=B), (lambda s: None), step, dict(weight_bytes=4 * L * (W * W + W), kv_bytes=0)


def copy_floor(nbytes, reps=30):
    """Median time of a device-to-device copy of nbytes (random data), in us."""
    n = (nbytes + 3) // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    del src, dst
    torch.cuda.empty_cache()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="gpt2-decode", choices=["gpt2-decode", "mlp"])
    for f in ["layers", "width", "heads", "kv-len", "batch", "vocab"]:
        ap.add_argument("--" + f, type=int, default=0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--attention", default="auto", choices=["auto"] + ATTENTION,
                    help="attention of gpt2-decode (auto: the fastest replay of all)")
    ap.add_argument("--trial-steps", type=int, default=30, help="replayed steps timed per attention trial (auto)")
    ap.add_argument("--floor", action="store_true", help="also time a device-to-device copy of the step's bytes")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.set_grad_enabled(False)
    shape, feed, step_of, floor = (gpt2 if args.workload == "gpt2-decode" else mlp)(args, dev)

    def timed(run, steps=args.steps):
        for s in range(args.warmup):
            feed(s)
            run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(steps):
            feed(args.warmup + s)
            run()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e6

    def warm_up(step):
        """Three steps on a side stream, as torch.cuda.graph requires before a capture."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for s in range(3):
                feed(s)
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def capture(step):
        """Warm up, then capture one step."""
        warm_up(step)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        torch.cuda.synchronize()
        return graph, out

    trials = {}
    kinds = ATTENTION if args.attention == "auto" else [args.attention]
    if args.workload != "gpt2-decode":
        kinds = ["none"]
    elif len(kinds) > 1:
        for kind in kinds:
            try:
                graph, _ = capture(lambda: step_of(kind))
                trials[kind] = round(timed(graph.replay, args.trial_steps), 1)
                del graph
            except Exception as e:  # a backend that refuses the shape
                trials[kind] = "error: " + str(e).strip().splitlines()[0][:120]
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        ok = {k: v for k, v in trials.items() if not isinstance(v, str)}
        kinds = [min(ok, key=ok.get)]
    kind = kinds[0]

    def step():
        return step_of(kind)

    eager_us = timed(step)

    # Capture: warm up, empty the cache so the pool delta is the graph's
    # alone, then capture.
    warm_up(step)
    torch.cuda.empty_cache()
    reserved0, alloc0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.cuda.graph(graph):
        out = step()
    torch.cuda.synchronize()
    capture_ms = (time.perf_counter() - t0) * 1e3
    pool = torch.cuda.memory_reserved() - reserved0
    live_after = torch.cuda.memory_allocated() - alloc0
    replay_us = timed(graph.replay)
    res = dict(framework="torch " + torch.__version__, device=torch.cuda.get_device_name(), workload=args.workload,
               shape=shape, dtype="fp32", steps=args.steps, attention=kind, attention_trials=trials,
               eager_us_per_step=round(eager_us, 1),
               replay_us_per_step=round(replay_us, 1), capture_ms=round(capture_ms, 3),
               private_pool_bytes=pool, live_after_capture_bytes=live_after, output_shape=list(out.shape))
    if args.floor:
        del graph
        torch.cuda.empty_cache()
        nbytes = floor["weight_bytes"] + floor["kv_bytes"]
        copy_us = copy_floor(nbytes)
        res.update(floor, floor_bytes=nbytes, copy_us=round(copy_us, 1), copy_rate_tbs=round(2 * nbytes / copy_us / 1e6, 3),
                   floor_us=round(copy_us / 2, 1))
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:28s} {v}")


if __name__ == "__main__":
    main()
