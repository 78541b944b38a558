#!/usr/bin/env python3
"""A tensor-parallel step captured with its NCCL all-reduces inside the
graph, with PyTorch's own allocator or with arenaplan's, one process per
GPU (torchrun; the allocator is process-wide). Two models: a Llama decode
step (--model llama, the default) and an MLP-heavy step whose all-reduces
have three sizes (--model mlp, see build_mlp).

    torchrun --standalone --nproc_per_node=N bench/torch_tp.py --mode torch
    torchrun --standalone --nproc_per_node=N bench/torch_tp.py --mode ours --plan-out 'plans/w{world}-r{rank}.plan'
    torchrun --standalone --nproc_per_node=N bench/torch_tp.py --mode ours --plan 'plans/w{world}-r{rank}.plan' \\
        --foreign-plan 'plans/w{world}-r{next}.plan'

The step: Llama-3.2-1B's shapes (hidden 2048, 32 heads, 8 KV heads, MLP
8192, vocab 128256; --layers of its 16), bf16, a static KV cache, random
weights, written with plain torch.distributed: QKV and gate/up are
column-parallel (each rank holds heads/N and 8192/N of the MLP), o and down
are row-parallel and followed by dist.all_reduce; embedding, norms and the
LM head are replicated. Every rank prints one JSON line (and writes it to
--json-out): the lower bound and arena/LB (ours), graph memory (PyTorch:
memory_reserved growth across the capture, cache emptied first; ours:
report()["graph_bytes"]), capture ms, replay and eager µs (a pair of
CUDA events per call: fastest, median and p90 of --blocks blocks of
--iters calls, each block begun on every rank together), replay == eager bit for bit, the
same logits on every rank, divergences; the kernels a profiled replay ran
(an NCCL kernel among them puts the all-reduce inside the graph) and, for
PyTorch's graph (kept with keep_graph=True), its node types and kernel
names read from the driver (cuGraphGetNodes); that the graph's memory is
on this rank's GPU; with --pause, replays after pause/resume of every
rank's graphs equal those before; plan files refused for another rank or
world size (--foreign-plan).

Exit: the graphs (which hold NCCL's resources) are released before the
process group is destroyed, so every rank exits by itself; a rank that
fails prints its error and exits 1 at once.

Placeholders in plan paths: {rank}, {world}, {next} (the next rank).
NCCL: graphs that registered user buffers keep stale registrations after a
same-address resume, so ours runs with NCCL_GRAPH_REGISTER=0 unless the
environment says otherwise (the value used is reported).
"""
import argparse
import ctypes
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_bridge import per_call, warm_stream  # noqa: E402


def build(torch, F, dist, a, rank, world, dev, ctl):
    """Returns the decode step (no arguments; closes over static inputs)
    of this rank's shard, with weights from generators seeded so that
    replicated tensors are equal on every rank. ctl["allreduce"] False
    skips the all-reduces (eager diagnosis only: the ranks then differ)."""
    W, H, KV, I, V, L, B, T = a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab, a.layers, a.batch, a.kv_len
    if H % world or KV % world or I % world:
        raise SystemExit(f"heads {H}, KV heads {KV} and MLP {I} must divide by the world size {world}")
    hd, Hl, KVl, Il = W // H, H // world, KV // world, I // world
    dt = torch.bfloat16

    def rnd(seed, *shape, scale=None):
        g = torch.Generator(device=dev).manual_seed(seed)
        scale = shape[-1] ** -0.5 if scale is None else scale
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dt)

    rep, mine = 1000, 1_000_000 * (rank + 1)  # seeds: replicated, this rank's shard
    emb = rnd(rep, V, W, scale=1.0)
    head = rnd(rep + 1, V, W)
    nf = torch.ones(W, device=dev, dtype=dt)
    layers = []
    for l in range(L):
        s = mine + 100 * l
        layers.append(dict(
            n1=torch.ones(W, device=dev, dtype=dt), n2=torch.ones(W, device=dev, dtype=dt),
            qkv=rnd(s, (Hl + 2 * KVl) * hd, W),        # column-parallel: this rank's heads
            o=rnd(s + 1, W, Hl * hd),                   # row-parallel: partial sums
            gu=rnd(s + 2, 2 * Il, W),                   # column-parallel: gate and up, this rank's slice
            down=rnd(s + 3, W, Il),                     # row-parallel
            k=rnd(s + 4, B, KVl, T, hd, scale=0.5), v=rnd(s + 5, B, KVl, T, hd, scale=0.5)))
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    ar = torch.arange(T, device=dev)
    S = a.prefill or 1  # tokens a sequence: the prompt (prefill), else one (decode)
    if S > T:
        raise SystemExit(f"--prefill {S} is longer than the KV cache ({T})")
    tok = torch.randint(0, V, (B, S), device=dev, generator=torch.Generator(device=dev).manual_seed(rep + 2))
    pos = torch.arange(S, device=dev) if a.prefill else torch.tensor([T * 7 // 8], device=dev)

    def rope(x):
        f = pos.float()[:, None] * inv[None, :]
        cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    def reduce(t):
        if ctl["allreduce"]:
            dist.all_reduce(t)

    def step():
        with torch.no_grad():
            x = F.embedding(tok, emb)
            mask = None if a.prefill else (ar <= pos).view(1, 1, 1, T)
            for p in layers:
                h = F.rms_norm(x, (W,), p["n1"])
                q, k, v = F.linear(h, p["qkv"]).split([Hl * hd, KVl * hd, KVl * hd], -1)
                q = rope(q.view(B, S, Hl, hd).transpose(1, 2))
                k = rope(k.view(B, S, KVl, hd).transpose(1, 2))
                v = v.view(B, S, KVl, hd).transpose(1, 2)
                p["k"].index_copy_(2, pos, k)
                p["v"].index_copy_(2, pos, v)
                if a.prefill:  # the prompt attends to itself, causally
                    att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KVl != Hl)
                else:
                    att = F.scaled_dot_product_attention(q, p["k"], p["v"], attn_mask=mask, enable_gqa=KVl != Hl)
                o = F.linear(att.transpose(1, 2).reshape(B, S, Hl * hd), p["o"])
                reduce(o)
                x = x + o
                h = F.rms_norm(x, (W,), p["n2"])
                g, u = F.linear(h, p["gu"]).chunk(2, -1)
                d = F.linear(F.silu(g) * u, p["down"])
                reduce(d)
                x = x + d
            return F.linear(F.rms_norm(x[:, -1:], (W,), nf), head)  # the next token's logits
    return step, emb


def build_mlp(torch, F, dist, a, rank, world, dev, ctl):
    """Returns an MLP-heavy tensor-parallel step of another shape than the
    decode: --tokens tokens of width --hidden through --mlp-layers MLP
    blocks whose widths cycle through I, I/2 and 2I (I = --intermediate),
    each block column-parallel up, GELU, a norm over the whole sharded
    intermediate (an all-reduce of one fp32 per token), row-parallel down
    (an all-reduce of the block's output), then a row-parallel classifier
    of --classes in fp32 (a third all-reduce, of another size)."""
    W, I, L, N, C = a.hidden, a.intermediate, a.mlp_layers, a.tokens, a.classes
    widths = [(I, I // 2, 2 * I)[l % 3] for l in range(L)]
    if any(w % world for w in widths) or W % world:
        raise SystemExit(f"MLP widths {sorted(set(widths))} and hidden {W} must divide by the world size {world}")
    dt = torch.bfloat16

    def rnd(seed, *shape, scale=None):
        g = torch.Generator(device=dev).manual_seed(seed)
        scale = shape[-1] ** -0.5 if scale is None else scale
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dt)

    rep, mine = 2000, 3_000_000 * (rank + 1)
    inp = rnd(rep, N, W, scale=1.0)
    Wl = W // world
    head = rnd(mine, C, Wl, scale=W ** -0.5)  # row-parallel: this rank's slice of the hidden
    nf = torch.ones(W, device=dev, dtype=dt)
    layers = []
    for l, w in enumerate(widths):
        s = mine + 100 * l
        layers.append(dict(n=torch.ones(W, device=dev, dtype=dt), width=w,
                           up=rnd(s, w // world, W), down=rnd(s + 1, W, w // world, scale=w ** -0.5)))

    def reduce(t):
        if ctl["allreduce"]:
            dist.all_reduce(t)

    def step():
        with torch.no_grad():
            x = inp
            for p in layers:
                h = F.rms_norm(x, (W,), p["n"])
                u = F.gelu(F.linear(h, p["up"]))
                ss = u.float().pow(2).sum(-1, keepdim=True)
                reduce(ss)  # N fp32: the sum of squares over every rank's slice
                u = u * torch.rsqrt(ss / p["width"] + 1e-6).to(dt)
                d = F.linear(u, p["down"])
                reduce(d)  # N x W bf16
                x = x + d
            h = F.rms_norm(x, (W,), nf)[:, rank * Wl:(rank + 1) * Wl]
            out = F.linear(h, head).float()
            reduce(out)  # N x C fp32
            return out
    return step, inp


def short(name):
    """A mangled C++ name's qualified name (_ZN2at6native...E -> at::native::...)."""
    m = re.match(r"_Z(N?)", name)
    if not m:
        return name
    i, parts = m.end(), []
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j:j + n])
        i = j + n
        if not m.group(1):
            break
    return "::".join(parts) or name


NODE_TYPES = ["kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event", "event_record",
              "ext_semas_signal", "ext_semas_wait", "mem_alloc", "mem_free", "batch_mem_op", "conditional"]


def graph_nodes(raw):
    """Node types and kernel names of a CUDA graph (a cudaGraph_t), read
    with the driver API: {"types": {type: count}, "kernels": [names]}."""
    cu = ctypes.CDLL("libcuda.so.1")
    vp = ctypes.c_void_p

    class KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
        _fields_ = [("func", vp), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                    ("shared", ctypes.c_uint), ("params", vp), ("extra", vp), ("kern", vp), ("ctx", vp)]

    def ok(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUresult {r}")

    types, kernels = {}, []

    def walk(g):
        n = ctypes.c_size_t(0)
        ok(cu.cuGraphGetNodes(vp(g), None, ctypes.byref(n)), "cuGraphGetNodes")
        nodes = (vp * n.value)()
        ok(cu.cuGraphGetNodes(vp(g), nodes, ctypes.byref(n)), "cuGraphGetNodes")
        for node in nodes:
            t = ctypes.c_int(-1)
            ok(cu.cuGraphNodeGetType(vp(node), ctypes.byref(t)), "cuGraphNodeGetType")
            name = NODE_TYPES[t.value] if 0 <= t.value < len(NODE_TYPES) else str(t.value)
            types[name] = types.get(name, 0) + 1
            if name == "kernel":
                p = KernelParams()
                ok(cu.cuGraphKernelNodeGetParams_v2(vp(node), ctypes.byref(p)), "cuGraphKernelNodeGetParams_v2")
                s = ctypes.c_char_p()
                if p.func:
                    r = cu.cuFuncGetName(ctypes.byref(s), vp(p.func))
                else:
                    r = cu.cuKernelGetName(ctypes.byref(s), vp(p.kern))
                kernels.append(short(s.value.decode()) if r == 0 and s.value else f"? (CUresult {r})")
            elif name == "graph":
                child = vp()
                ok(cu.cuGraphChildGraphNodeGetGraph(vp(node), ctypes.byref(child)), "cuGraphChildGraphNodeGetGraph")
                walk(child.value)
    walk(raw)
    return {"types": types, "kernels": kernels}


def profiled_kernels(torch, replay, n, path):
    """The GPU kernels that n profiled replays ran (torch.profiler, CUDA
    activity), in order, and how many carried a graph id."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    ks = [e for e in ev if e.get("cat") == "kernel"]
    names = [e.get("name", "") for e in ks]
    in_graph = sum(1 for e in ks if (e.get("args") or {}).get("graph id") not in (None, 0))
    return names, in_graph


def on_this_gpu(torch, t, dev):
    """Whether tensor t's memory is on the GPU that PyTorch calls dev (the
    driver's answer for the pointer, compared by PCI address)."""
    cu = ctypes.CDLL("libcuda.so.1")
    ordinal = ctypes.c_int(-1)
    if cu.cuPointerGetAttribute(ctypes.byref(ordinal), 9, ctypes.c_uint64(t.data_ptr())) != 0:  # DEVICE_ORDINAL
        return None
    d = ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(d), ordinal)
    got = []
    for attr in (50, 33, 34):  # PCI domain, bus, device
        v = ctypes.c_int()
        cu.cuDeviceGetAttribute(ctypes.byref(v), attr, d)
        got.append(v.value)
    p = torch.cuda.get_device_properties(dev)
    want = [getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    return None if None in want else got == want


def checksum(torch, t):
    return int(t.contiguous().view(torch.int16).to(torch.int64).sum())


def timed_ranks(torch, dist, fn, iters, blocks):
    """(fastest, median, p90) µs of one call (per_call), every block
    begun on all ranks together: a rank's step waits at each all-reduce
    for the slowest rank, so a block that one rank starts late measures
    that rank's lateness, not the step."""
    def begin():
        dist.barrier()
        torch.cuda.synchronize()
    return per_call(torch, fn, iters, blocks, begin)


def pin(rank, world):
    """Gives this rank its own contiguous share of the CPUs the process may
    use (threads made later inherit it), so that ranks never share a core
    with one another; returns the CPUs, or None where it cannot."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None
    per = len(cpus) // max(world, 1)
    if per < 2:
        return None
    mine = cpus[rank * per:(rank + 1) * per]
    os.sched_setaffinity(0, mine)
    return [mine[0], mine[-1]]


def eager_diag(torch, dist, step, ctl, a, r, ap):
    """Where an eager step's time goes: host time per step, the step
    without its all-reduces, one allocation and free of a small tensor,
    arenaplan's counters per step, and a profile (top CPU ops by self
    time, CUDA API calls, GPU busy time) per step."""
    d = {}
    n = max(a.iters // 5, 5)

    def host(fn, k):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / k
    d["host_us"] = host(step, n)
    ctl["allreduce"] = False
    d["no_allreduce_us"] = timed_ranks(torch, dist, step, n, a.blocks)[1]
    ctl["allreduce"] = True
    dev = torch.cuda.current_device()
    small = lambda: torch.empty(16384, dtype=torch.bfloat16, device=dev)  # noqa: E731
    host(small, 1000)
    d["alloc_free_us"] = host(small, 20000)
    if ap is not None:
        s0 = ap.stats()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        s1 = ap.stats()

        def delta(path):
            x0, x1 = s0, s1
            for k in path:
                x0, x1 = x0[k], x1[k]
            return round((x1 - x0) / n, 1)
        d["per_step"] = {"/".join(k): delta(k) for k in (
            ("Allocs",), ("Frees",), ("Spilled",), ("FastPath", "Hits"), ("FastPath", "Misses"),
            ("FastPath", "Kept"), ("FastPath", "GoAllocs"), ("FastPath", "GoFrees"), ("FastPath", "FreeCalls"), ("FastPath", "Drains"),
            ("FastPath", "GrowthDrains"), ("Spill", "Allocs"), ("Spill", "Frees"), ("Spill", "Grows"),
            ("Spill", "Unmaps"), ("Spill", "CrossStreamFrees"), ("Spill", "EventQueries"), ("Spill", "Syncs"))}
        d["after"] = {k: s1["Spill"][k] for k in ("Waiting", "Live", "Mapped", "Segments")}
        d["after"]["fastpath_blocks"] = s1["FastPath"]["Blocks"]
    from torch.profiler import ProfilerActivity, profile
    k = 5
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(k):
            step()
        torch.cuda.synchronize()
    ops, api, gpu = {}, {}, 0.0
    for e in prof.key_averages():
        if e.device_type.name == "CPU":
            ops[e.key] = (e.count / k, e.self_cpu_time_total / k)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            ev = json.load(f)
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            c, t = api.get(e["name"], (0, 0.0))
            api[e["name"]] = (c + 1, t + e.get("dur", 0))
        elif e.get("cat") == "kernel":
            gpu += e.get("dur", 0)
    top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:12]
    d["top_self_cpu_us"] = {n_: [round(c, 1), round(t, 1)] for n_, (c, t) in top}
    d["cuda_api_us"] = {n_: [round(c / k, 1), round(t / k, 1)]
                        for n_, (c, t) in sorted(api.items(), key=lambda kv: -kv[1][1])[:10]}
    d["gpu_kernel_us"] = round(gpu / k, 1)
    r["eager_diag"] = d


def release(torch, objs):
    """Drops the graphs and the tensors that live in their memory: CUDA
    graphs that hold NCCL kernels must be gone before the process group is
    destroyed (else destroy_process_group waits forever)."""
    for o in objs:
        if o is None:
            continue
        if hasattr(o, "close"):
            o.close()
        elif hasattr(o, "reset"):
            o.reset()
    objs.clear()
    torch.cuda.synchronize()


def main(t_start):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["torch", "ours"], required=True)
    p.add_argument("--model", choices=["llama", "prefill", "mlp"], default="llama",
                   help="llama: the decode step; prefill: its prefill step (--prefill tokens, default 512, "
                        "batch 4); mlp: an MLP-heavy step with all-reduces of three sizes")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=None, help="sequences (default: decode 8, prefill 4)")
    p.add_argument("--kv-len", type=int, default=1024)
    p.add_argument("--prefill", type=int, default=0, metavar="TOKENS",
                   help="llama: a prefill step of this many tokens a sequence (written to the KV cache) instead of decode")
    p.add_argument("--mlp-layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--classes", type=int, default=4096)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--plan", help="ours: capture from this rank's plan file (placeholders {rank} {world} {next})")
    p.add_argument("--plan-out", help="ours: save this rank's plan here")
    p.add_argument("--foreign-plan", action="append", default=[],
                   help="ours: a plan file another rank or world size made: it must be refused (repeatable)")
    p.add_argument("--pause", type=int, default=0, metavar="CYCLES",
                   help="ours: pause and resume every rank's graphs CYCLES times, checking replays")
    p.add_argument("--label", metavar="R/W",
                   help="ours, tests only: tell arenaplan this process is rank R of W (to make another rank's "
                        "plan file on one GPU); the process group is unchanged")
    p.add_argument("--nondeterministic", action="store_true",
                   help="leave PyTorch's nondeterministic kernels on (then eager steps at batch 8 need not repeat "
                        "bit for bit, and neither replay == eager nor replays across a pause can be asked)")
    p.add_argument("--eager-diag", action="store_true",
                   help="also measure where eager time goes (host time, without all-reduces, counters, profile)")
    p.add_argument("--eager-only", action="store_true", help="no graph: eager timings (and --eager-diag) only")
    p.add_argument("--pin", action="store_true",
                   help="give each rank its own contiguous share of the CPUs (ranks never share a core)")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds a collective may wait for another rank before the process group fails")
    p.add_argument("--json-out", help="also append this rank's JSON line to this file ({rank} {world})")
    p.add_argument("--tag", default="", help="a name for this run in the JSON")
    a = p.parse_args()
    if a.model == "prefill":
        a.prefill = a.prefill or 512
    if a.batch is None:
        a.batch = 4 if a.prefill else 8

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", rank))
    fill = lambda s: s.format(rank=rank, world=world, next=(rank + 1) % world) if s else s  # noqa: E731
    cpus = pin(rank, world) if a.pin else None
    r = {"mode": a.mode, "model": a.model, "cpus": cpus, "tag": a.tag or a.mode, "rank": rank, "world": world,
         "layers": a.mlp_layers if a.model == "mlp" else a.layers,
         "batch": a.tokens if a.model == "mlp" else a.batch, "prefill": a.prefill}
    ap = None
    if a.mode == "ours":
        os.environ.setdefault("NCCL_GRAPH_REGISTER", "0")
        import arenaplan.torch as ap
        if a.label:
            # The library reads RANK and WORLD_SIZE once, at install.
            saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
            os.environ["RANK"], os.environ["WORLD_SIZE"] = a.label.split("/")
            ap.install()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            r["label"] = a.label
        else:
            ap.install()
    r["nccl_graph_register"] = os.environ.get("NCCL_GRAPH_REGISTER", "(unset: NCCL's default)")
    import datetime
    import torch
    import torch.distributed as dist
    if not a.nondeterministic:
        # Bit-for-bit comparisons need repeatable kernels: with the
        # defaults, eager decode steps at batch >= 8 differ run to run
        # (BENCHMARKS.md, "family"), PyTorch's own allocator too.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    r["deterministic"] = not a.nondeterministic
    import torch.nn.functional as F
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    # A rank that waits on a collective longer than --timeout fails (the
    # process group's watchdog ends the process) instead of hanging.
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=a.timeout))
    v = torch.cuda.nccl.version()
    r.update(device=torch.cuda.get_device_name(dev), torch=torch.__version__,
             nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    ctl = {"allreduce": True}
    step, weights = (build_mlp if a.model == "mlp" else build)(torch, F, dist, a, rank, world, dev, ctl)

    s = warm_stream(torch, step)
    r["eager_us"], r["eager_med_us"], r["eager_p90_us"] = timed_ranks(torch, dist, step, max(a.iters // 5, 5), a.blocks)
    if a.eager_diag:
        eager_diag(torch, dist, step, ctl, a, r, ap)
    held = []  # graphs to release before the process group goes
    if not a.eager_only:
        run_graph(torch, dist, step, a, r, ap, s, dev, weights, fill, world, held)
    r["results_s"] = round(time.time() - t_start, 2)
    line = json.dumps(r)
    print(line, flush=True)
    if a.json_out:
        os.makedirs(os.path.dirname(fill(a.json_out)) or ".", exist_ok=True)
        with open(fill(a.json_out), "a") as f:  # one write per line: ranks may share the file
            f.write(line + "\n")
    release(torch, held)
    dist.barrier()
    dist.destroy_process_group()


def run_graph(torch, dist, step, a, r, ap, s, dev, weights, fill, world, held):
    """Capture, replay, compare, profile; ours: refusals and pause/resume.
    Appends the graphs it keeps to held."""
    if a.mode == "torch":
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        try:
            graph = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:
            graph = torch.cuda.CUDAGraph()
        held.append(graph)
        t0 = time.perf_counter()
        with torch.cuda.graph(graph, stream=s):
            out = step()
        if hasattr(graph, "instantiate") and hasattr(graph, "raw_cuda_graph"):
            graph.instantiate()  # kept graphs instantiate lazily; count it in the capture, as ours does
        torch.cuda.synchronize()
        r["capture_ms"] = (time.perf_counter() - t0) * 1e3
        r["graph_bytes"] = torch.cuda.memory_reserved() - before
        replay, cs = graph.replay, s
        try:
            r["graph_nodes"] = graph_nodes(graph.raw_cuda_graph())
        except Exception as e:  # older torch, or a driver without cuFuncGetName
            r["graph_nodes_error"] = f"{type(e).__name__}: {e}"
    else:
        plan = fill(a.plan)
        g = ap.graph(step, plan=plan)
        held.append(g)
        if plan:
            r["plan"] = plan
        if a.plan_out:
            os.makedirs(os.path.dirname(fill(a.plan_out)) or ".", exist_ok=True)
            g.save(fill(a.plan_out))
            r["plan_out"] = fill(a.plan_out)
        rep = g.report()
        r.update({k: rep[k] for k in ("lower_bound", "arena", "ratio", "optimal", "arena_mapped", "spill_held",
                                      "graph_bytes", "buffers", "divergences", "first_divergence", "capture_ms",
                                      "record_ms", "plan_build_ms", "plan_ms", "captures", "served_capture_ms", "replans",
                                      "replan_reason", "last_run_divergences") if k in rep})
        out, replay, cs = g.outputs, g.replay, g.stream

    # Eager reference on the capture stream, then one replay.
    cs.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(cs):
        ref = step().clone()
    torch.cuda.synchronize()
    replay()
    torch.cuda.synchronize()
    r["replay_equal"] = bool(torch.equal(out, ref))
    first = out.clone()
    if not r["replay_equal"]:
        r["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
    sums = torch.tensor([checksum(torch, out)] * 2, device=dev)
    lo, hi = sums[:1].clone(), sums[1:].clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    r["same_logits_on_all_ranks"] = bool(lo.item() == hi.item())
    r["graph_memory_on_this_gpu"] = on_this_gpu(torch, out, dev)
    r["weights_on_this_gpu"] = on_this_gpu(torch, weights, dev)
    with torch.cuda.stream(cs):
        again = step().clone()
    torch.cuda.synchronize()
    r["eager_repeatable"] = bool(torch.equal(again, ref))
    r["replay_us"], r["replay_med_us"], r["replay_p90_us"] = timed_ranks(torch, dist, replay, a.iters, a.blocks)
    replay()
    torch.cuda.synchronize()
    r["replay_repeatable"] = bool(torch.equal(out, first))

    with tempfile.TemporaryDirectory() as tmp:
        names, in_graph = profiled_kernels(torch, replay, 3, os.path.join(tmp, "trace.json"))
    nccl = sorted({n for n in names if "nccl" in n.lower()})
    r["profiled_replay"] = {"kernels_per_replay": len(names) / 3, "with_graph_id": in_graph,
                            "nccl_kernels": nccl, "distinct_kernels": len({short(n) for n in names})}
    if "graph_nodes" in r:
        r["graph_nodes"]["nccl_kernels"] = sorted({n for n in r["graph_nodes"]["kernels"] if "nccl" in n.lower()})
        r["graph_nodes"]["kernels"] = len(r["graph_nodes"]["kernels"])
    r["allreduce_in_graph"] = bool(nccl) or bool(r.get("graph_nodes", {}).get("nccl_kernels"))
    if world == 1 and not r["allreduce_in_graph"]:
        r["allreduce_in_graph"] = "n/a: NCCL launches nothing for an in-place sum on one rank"

    if a.mode == "ours":
        r["divergences_after"] = g.report()["divergences"]
        refusals = {}
        for f in a.foreign_plan:
            f = fill(f)
            try:
                x = ap.graph(step, plan=f, warmup=0)
                x.close()
                refusals[f] = "ACCEPTED"
            except ap.ArenaplanError as e:
                refusals[f] = f"refused: {e}"
        if refusals:
            r["foreign_plans"] = refusals
            r["foreign_refused"] = all(v.startswith("refused") and "made by rank" in v for v in refusals.values())
        if a.pause:
            cyc = []
            for _ in range(a.pause):
                torch.cuda.synchronize()
                dist.barrier()
                free0 = torch.cuda.mem_get_info(dev)[0]
                t0 = time.perf_counter()
                ap.pause()
                t1 = time.perf_counter()
                free1 = torch.cuda.mem_get_info(dev)[0]
                dist.barrier()  # every rank paused at once, as an engine's sleep
                t2 = time.perf_counter()
                ap.resume()
                t3 = time.perf_counter()
                dist.barrier()
                replay()
                torch.cuda.synchronize()
                cyc.append({"returned_bytes": free1 - free0, "pause_ms": (t1 - t0) * 1e3, "resume_ms": (t3 - t2) * 1e3,
                            "equal": bool(torch.equal(out, first)), "equal_eager": bool(torch.equal(out, ref))})
                if not cyc[-1]["equal"]:
                    cyc[-1]["max_abs_diff"] = float((out.float() - first.float()).abs().max())
            # Equal to the replay before the first pause (and to eager,
            # where replays equal eager at all).
            r["pause"] = {"cycles": len(cyc), "all_equal": all(c["equal"] for c in cyc),
                          "all_equal_eager": all(c["equal_eager"] for c in cyc),
                          "returned_bytes_min": min(c["returned_bytes"] for c in cyc),
                          "pause_ms_max": max(c["pause_ms"] for c in cyc),
                          "resume_ms_max": max(c["resume_ms"] for c in cyc),
                          "max_abs_diff": max(c.get("max_abs_diff", 0.0) for c in cyc)}
            r["replay_us_after_pause"] = timed_ranks(torch, dist, replay, a.iters, a.blocks)[0]
        st = ap.stats()
        r["spill_mapped"] = st["Spill"]["Mapped"]


if __name__ == "__main__":
    t_start = time.time()
    try:
        import psutil
        t_start = psutil.Process().create_time()
    except Exception:
        pass
    # A hang anywhere (a rank that never reaches a collective, a teardown
    # that waits) prints every thread's stack and ends the process with
    # an error after TP_DEADLINE seconds.
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ.get("TP_DEADLINE", 600)), exit=True)
    try:
        main(t_start)
    except BaseException as e:  # noqa: BLE001: every failure ends this rank with a clear error, now
        if isinstance(e, SystemExit) and e.code in (None, 0):
            raise
        import traceback
        traceback.print_exc()
        print(f"rank {os.environ.get('RANK', 0)} of {os.environ.get('WORLD_SIZE', 1)}: failed: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        # Not a normal exit: destroying the process group or freeing
        # graphs could wait for the other ranks, which wait for this one.
        os._exit(1)
