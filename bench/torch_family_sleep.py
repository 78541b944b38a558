#!/usr/bin/env python3
"""Batch-size families and sleep/wake from PyTorch, one process
per mode.

    python3 bench/torch_family_sleep.py --mode torch   # PyTorch at its best
    python3 bench/torch_family_sleep.py --mode ours    # arenaplan.torch.graphs + pause/resume

The model: a Llama-architecture decode step with Llama-3.2-1B's shapes (16
layers, 2048 wide, 32 heads, 8 KV heads, vocab 128256, bf16, random
weights) and a static KV cache allocated once at the largest batch size;
the member for batch B reads and writes its first B rows.

PyTorch at its best (vLLM's recipe): the graphs captured largest first into
ONE pool (torch.cuda.graph_pool_handle()), each graph's output kept only as
a weak reference (a tensor that does not own its memory), so that smaller
graphs may reuse it. Graph memory: memory_reserved growth across the
captures, printed after each size.

Ours: arenaplan.torch.graphs over the same sizes (one planned arena), then
sleep/wake: weights in region("weights", backup=True), the KV cache in
region("kv") (dropped), the graphs dropped; cycles of pause()/resume(),
the KV cache refilled after each resume as an engine re-prefills.

Both: a mixed sequence of replays, each compared bit for bit with the
eager step of its size. Prints one JSON line.
"""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

SIZES = [256, 128, 64, 32, 16, 8, 4, 2, 1]


def build(torch, dev, layers, T, bmax):
    import torch.nn as nn
    import torch.nn.functional as F
    W, H, KV, I, V = 2048, 32, 8, 8192, 128256
    hd = W // H

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(W), nn.RMSNorm(W)
            self.qkv = nn.Linear(W, (H + 2 * KV) * hd, bias=False)
            self.o = nn.Linear(W, W, bias=False)
            self.gu = nn.Linear(W, 2 * I, bias=False)
            self.down = nn.Linear(I, W, bias=False)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, W)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.nf = nn.RMSNorm(W)
            self.head = nn.Linear(W, V, bias=False)
            self.register_buffer("inv", 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd)))
            self.register_buffer("ar", torch.arange(T))

        def rope(self, x, pos):
            f = pos.float()[:, None] * self.inv[None, :]
            cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
            x1, x2 = x[..., ::2], x[..., 1::2]
            return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

        def forward(self, tok, pos, kcache, vcache):
            B = tok.shape[0]
            x = self.emb(tok)
            mask = (self.ar <= pos).view(1, 1, 1, T)
            for i, l in enumerate(self.layers):
                h = l.n1(x)
                q, k, v = l.qkv(h).split([H * hd, KV * hd, KV * hd], -1)
                q = self.rope(q.view(B, 1, H, hd).transpose(1, 2), pos)
                k = self.rope(k.view(B, 1, KV, hd).transpose(1, 2), pos)
                v = v.view(B, 1, KV, hd).transpose(1, 2)
                kc, vc = kcache[i, :B], vcache[i, :B]
                kc.index_copy_(2, pos, k)
                vc.index_copy_(2, pos, v)
                a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
                x = x + l.o(a.transpose(1, 2).reshape(B, 1, W))
                g, u = l.gu(l.n2(x)).chunk(2, -1)
                x = x + l.down(F.silu(g) * u)
            return self.head(self.nf(x))

    torch.manual_seed(0)
    m = M().to(dev, torch.bfloat16).eval()
    return m, (KV, hd, V)


def make_cache(torch, dev, layers, bmax, KV, T, hd):
    g = torch.Generator(device=dev).manual_seed(1)
    k = torch.randn(layers, bmax, KV, T, hd, device=dev, dtype=torch.bfloat16, generator=g) * 0.5
    v = torch.randn(layers, bmax, KV, T, hd, device=dev, dtype=torch.bfloat16, generator=g) * 0.5
    return k, v


def weak_ref(torch, t):
    """A tensor over t's memory that does not own it (vLLM's
    weak_ref_tensor), through __cuda_array_interface__."""
    class CAI:
        pass
    o = CAI()
    typestr = {torch.bfloat16: "<f2", torch.float16: "<f2", torch.float32: "<f4"}[t.dtype]
    o.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": typestr, "data": (t.data_ptr(), False),
                                  "version": 3, "strides": tuple(s * t.element_size() for s in t.stride())}
    w = torch.as_tensor(o, device=t.device)
    return w.view(t.dtype) if t.dtype == torch.bfloat16 else w


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--mode", choices=["torch", "ours"], required=True)
    a.add_argument("--layers", type=int, default=16)
    a.add_argument("--kv-len", type=int, default=1024)
    a.add_argument("--sizes", default=",".join(map(str, SIZES)))
    a.add_argument("--cycles", type=int, default=100)
    a.add_argument("--checked-cycles", type=int, default=10)
    a.add_argument("--save-plan", help="ours: write the family plan here")
    a.add_argument("--plan", help="ours: capture once per size from this family plan file")
    a.add_argument("--record", default="auto", choices=["auto", "eager", "capture"],
                   help="ours: how ap.graphs records each member (see arenaplan.torch.graph)")
    a.add_argument("--nondeterministic", action="store_true",
                   help="leave PyTorch's nondeterministic kernels on (then eager steps at larger batches do not repeat bit for bit)")
    args = a.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")}, reverse=True)
    bmax, T, L = sizes[0], args.kv_len, args.layers
    if args.mode == "ours":
        import arenaplan.torch as ap
        ap.install()
    import torch
    if not args.nondeterministic:
        # Bit-for-bit comparisons need repeatable kernels (measured: with
        # the defaults, eager steps at batch >= 8 differ run to run with
        # PyTorch's own allocator).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    r = {"mode": args.mode + ("-plan" if args.plan else ""), "deterministic": not args.nondeterministic, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
         "layers": L, "kv_len": T, "sizes": sizes}
    region = (lambda tag, **kw: ap.region(tag, **kw)) if args.mode == "ours" else (lambda tag, **kw: _null())
    with region("weights", backup=True):
        m, (KV, hd, V) = build(torch, dev, L, T, bmax)
    with region("kv"):
        kc, vc = make_cache(torch, dev, L, bmax, KV, T, hd)
    kc_host, vc_host = kc.cpu(), vc.cpu()
    toks = torch.randint(0, V, (bmax, 1), device=dev)
    pos = torch.tensor([T * 7 // 8], device=dev)

    def make_step(B):
        tok = toks[:B]

        def step():
            with torch.no_grad():
                return m(tok, pos, kc, vc)
        return step
    steps = {B: make_step(B) for B in sizes}
    # Eager references, on a side stream as the captures run.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    ref = {}
    with torch.cuda.stream(s):
        for B in sizes:
            for _ in range(2):
                out = steps[B]()
            ref[B] = out.clone()
            del out
    torch.cuda.synchronize()
    # Is the eager step itself repeatable bit for bit? Where it is not, no
    # replay can equal it.
    again = {}
    with torch.cuda.stream(s):
        for B in sizes:
            again[B] = bool(torch.equal(steps[B](), ref[B]))
    torch.cuda.synchronize()
    r["eager_repeatable"] = {str(B): v for B, v in again.items()}
    r["weights_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())
    r["kv_bytes"] = kc.numel() * kc.element_size() * 2

    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    if args.mode == "torch":
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        graphs, outs, curve, cap_ms, parts = {}, {}, [], {}, {}
        for B in sizes:
            t0 = time.perf_counter()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=s):
                t1 = time.perf_counter()
                out = steps[B]()
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            torch.cuda.synchronize()
            cap_ms[B] = (time.perf_counter() - t0) * 1e3
            parts[str(B)] = [[round((t1 - t0) * 1e3, 2), round((t2 - t1) * 1e3, 2), round((t3 - t2) * 1e3, 2)]]
            outs[B] = weak_ref(torch, out)
            del out
            graphs[B] = g
            curve.append([B, torch.cuda.memory_reserved() - before])
        r["graph_bytes"] = curve[-1][1]
        r["curve"] = curve
        r["capture_parts_ms"] = parts
        replay = lambda B: (graphs[B].replay(), outs[B])[1]  # noqa: E731
    else:
        t0 = time.perf_counter()
        fam = ap.graphs(steps, warmup=2, plan=args.plan, record=args.record)
        if args.save_plan:
            fam.save(args.save_plan)
        r["family_total_ms"] = (time.perf_counter() - t0) * 1e3
        rep = fam.report()
        r["lower_bound"] = rep["lower_bound"]
        r["arena"] = rep["arena"]
        r["ratio"] = rep["ratio"]
        r["arena_mapped"] = rep["arena_mapped"]
        r["spill_held"] = rep["spill_held"]
        r["graph_bytes"] = rep["graph_bytes"]
        r["plan_ms"] = rep["plan_build_ms"]
        cap_ms = rep["capture_ms"]  # the served capture(s) of each member
        r["record_ms"] = {str(k): round(v, 1) for k, v in rep["record_ms"].items()}
        r["captures"] = {str(k): v for k, v in rep["captures"].items()}
        r["replans"] = {mm["name"]: mm["replans"] for mm in rep["members"]}
        r["capture_parts_ms"] = {str(k): v for k, v in rep["capture_parts_ms"].items()}
        r["divergences"] = sum(mm["divergences"] for mm in rep["members"])
        # What each size adds, largest first: the arena grows to the
        # largest member's end so far; spill held per member adds.
        curve, hi, held = [], 0, 0
        for mm in rep["members"]:
            hi = max(hi, mm["arena"])
            held += mm.get("spill_held", 0)
            curve.append([int(mm["name"]), hi + held])
        r["curve"] = curve
        r["member_lower_bounds"] = {mm["name"]: mm["lower_bound"] for mm in rep["members"]}
        replay = fam.replay
    r["device_bytes_for_graphs"] = free0 - torch.cuda.mem_get_info()[0]
    r["capture_ms"] = {str(k): round(v, 1) for k, v in cap_ms.items()}
    # Per size, as the target counts it: capture(s) plus an equal share of
    # the family's planning (ours); PyTorch: its capture.
    share = r.get("plan_ms", 0.0) / len(cap_ms)
    r["per_size_ms"] = {str(k): round(v + share, 1) for k, v in cap_ms.items()}
    r["max_added_bytes"] = max(b - a for (_, a), (_, b) in zip(r["curve"], r["curve"][1:])) if len(sizes) > 1 else 0

    def restore_kv():
        kc.copy_(kc_host)
        vc.copy_(vc_host)

    def check_mixed(n=40, seed=0):
        rng = random.Random(seed)
        seq = [rng.choice(sizes) for _ in range(n)]
        bad = []
        for B in seq:
            o = replay(B)
            torch.cuda.synchronize()
            if not torch.equal(o, ref[B]):
                bad.append(B)
        return len(seq) - len(bad), bad

    # Is a replay repeatable (the same graph twice)?
    rr = {}
    for B in sizes:
        a1 = replay(B).clone()
        a2 = replay(B)
        torch.cuda.synchronize()
        rr[str(B)] = bool(torch.equal(a1, a2))
    r["replay_repeatable"] = rr
    ok, bad = check_mixed()
    r["mixed_equal"], r["mixed_bad_sizes"] = ok, sorted(set(bad))
    # Replay time of each size (CUDA events, mean of 50 after 10).
    times = {}
    for B in sizes:
        for _ in range(10):
            replay(B)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(50):
            replay(B)
        e1.record()
        e1.synchronize()
        times[str(B)] = round(e0.elapsed_time(e1) * 1000 / 50, 1)
    r["replay_us"] = times

    if args.mode == "ours" and args.cycles > 0:
        r["sleep"] = sleep_wake(torch, ap, args, restore_kv, check_mixed, r)
    print(json.dumps(r), flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def rss_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def sleep_wake(torch, ap, args, restore_kv, check_mixed, r):
    cycles = []
    for c in range(args.cycles):
        torch.cuda.synchronize()
        st0 = ap.stats()
        f0 = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        ap.pause("weights")
        t1 = time.perf_counter()
        ap.pause()  # the rest: kv and graphs
        t2 = time.perf_counter()
        st1 = ap.stats()
        f1 = torch.cuda.mem_get_info()[0]
        ours_before = st0["Spill"]["Mapped"] + st0["ArenaMapped"]
        released_ours = st1["Spill"]["Paused"] + st0["ArenaMapped"]
        t3 = time.perf_counter()
        ap.resume("weights")
        t4 = time.perf_counter()
        ap.resume()
        t5 = time.perf_counter()
        restore_kv()
        torch.cuda.synchronize()
        f2 = torch.cuda.mem_get_info()[0]
        row = {"cycle": c, "returned": f1 - f0, "paused_by_us": released_ours, "mapped_before": ours_before,
               "backup_bytes": st1["Spill"]["Backup"], "pause_weights_s": t1 - t0,
               "pause_rest_s": t2 - t1, "resume_weights_s": t4 - t3, "resume_rest_s": t5 - t4,
               "wake_s": t5 - t3, "device_free_after": f2, "rss": rss_bytes()}
        if c < args.checked_cycles:
            ok, bad = check_mixed(n=18, seed=c + 1)
            row["replays_equal"], row["bad"] = ok, bad
        cycles.append(row)
    w = r["weights_bytes"]
    out = {"cycles": len(cycles), "first": cycles[0], "last": cycles[-1]}
    later = cycles[1:] or cycles
    out["backup_GiBps_first"] = w / cycles[0]["pause_weights_s"] / 2**30
    out["restore_GiBps_first"] = w / cycles[0]["resume_weights_s"] / 2**30
    out["backup_GiBps_min_later"] = min(w / c["pause_weights_s"] / 2**30 for c in later)
    out["restore_GiBps_min_later"] = min(w / c["resume_weights_s"] / 2**30 for c in later)
    out["backup_GiBps_median_later"] = sorted(w / c["pause_weights_s"] / 2**30 for c in later)[len(later) // 2]
    out["restore_GiBps_median_later"] = sorted(w / c["resume_weights_s"] / 2**30 for c in later)[len(later) // 2]
    out["wake_s_median"] = sorted(c["wake_s"] for c in later)[len(later) // 2]
    out["returned_fraction_min"] = min(c["returned"] / c["paused_by_us"] for c in cycles)
    out["checked_cycles_all_equal"] = all(c.get("bad", []) == [] for c in cycles)
    out["device_free_after_range"] = [min(c["device_free_after"] for c in later), max(c["device_free_after"] for c in later)]
    out["rss_range"] = [min(c["rss"] for c in later), max(c["rss"] for c in later)]
    out["backup_bytes_range"] = [min(c["backup_bytes"] for c in later), max(c["backup_bytes"] for c in later)]
    return out


if __name__ == "__main__":
    main()
