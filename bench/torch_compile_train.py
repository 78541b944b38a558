#!/usr/bin/env python3
"""Training with torch.compile: arenaplan's backend (forward and backward
captured as one chain in one arena) against mode="reduce-overhead"
(CUDAGraph Trees on PyTorch's allocator), one model and mode a process.

    python3 bench/torch_compile_train.py --mode reduce-overhead --model gpt2
    python3 bench/torch_compile_train.py --mode ours --model gpt2
    python3 bench/torch_compile_train.py --summary results.jsonl

The loop is the usual one: zero_grad(set_to_none=True), the compiled
model's loss, backward, AdamW (fused) step, every step the same batch
(mlp-last: a partial batch every fourth step, a second shape); attention on
PyTorch's math kernel, deterministic (gpt2-eff: PyTorch's choice).
Prints one JSON line: the compiled graphs' report (ours: arena, lower bound
of the forward and backward's joint timeline, captures, calls without a
graph), the graph memory (reduce-overhead: CUDAGraph Trees' pool), the
process's reserved memory after the steps (PyTorch's counter; under
arenaplan its own, in PyTorch's schema) and its peak, the step time (CUDA
events, fastest of 5 blocks of --iters steps; by default 10, and 100 for the
MLPs, whose step of about a millisecond is bound by the host), the first
calls' times, the losses, and a checksum of the parameters after the steps
(saved under --save, so that the summary compares the two modes bit for
bit).
Random weights; dropout off; nothing is downloaded.
"""
import argparse
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

MODELS = ["gpt2", "vit", "mlp", "gpt2-eff", "mlp-last"]


def build(name, torch, dev):
    """(module returning a scalar loss, its inputs)."""
    torch.manual_seed(0)
    if name in ("gpt2", "gpt2-eff"):
        from transformers import GPT2Config, GPT2LMHeadModel

        class LM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                cfg = GPT2Config(use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                 attn_implementation="sdpa")
                self.m = GPT2LMHeadModel(cfg)

            def forward(self, ids):
                return self.m(input_ids=ids, labels=ids).loss
        return LM().to(dev), (torch.randint(0, 50257, (8, 256), device=dev),)
    if name == "vit":
        import torchvision

        class Cls(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = torchvision.models.vit_b_16()

            def forward(self, x, y):
                return torch.nn.functional.cross_entropy(self.m(x), y)
        x = torch.randn(32, 3, 224, 224, device=dev)
        return Cls().to(dev), (x, torch.randint(0, 1000, (32,), device=dev))
    if name in ("mlp", "mlp-last"):
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                             torch.nn.Linear(4096, 1024), torch.nn.LayerNorm(1024))

            def forward(self, x):
                return self.m(x).square().mean()
        return MLP().to(dev), (torch.randn(256, 1024, device=dev),)
    raise SystemExit(f"unknown model {name}")


def run(args):
    # cuBLAS's deterministic workspace: the same kernels and sums on every
    # stream (the captures run on their own).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    ours = args.mode == "ours"
    if ours:
        import arenaplan.torch as ap
        import arenaplan.compile as apc
        ap.install()
    dev = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    model, inputs = build(args.model, torch, dev)
    # mlp-last: every fourth step takes the last, partial batch of an epoch
    # (a second shape: its own chain).
    partial = tuple(x[:200] for x in inputs) if args.model == "mlp-last" else None
    count = [0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fast = torch.compile(model, backend="arenaplan") if ours else torch.compile(model, mode="reduce-overhead")
    torch.cuda.synchronize()
    res = {"model": args.model, "mode": args.mode, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    # PyTorch's math attention: deterministic, so the two modes' weights
    # can be compared bit for bit after the steps ("-eff": PyTorch's choice,
    # the efficient kernel, whose backward is not deterministic).
    import contextlib
    from torch.nn.attention import SDPBackend, sdpa_kernel
    attention = contextlib.nullcontext if args.model.endswith("-eff") else lambda: sdpa_kernel(SDPBackend.MATH)

    def step():
        count[0] += 1
        batch = partial if partial is not None and count[0] % 4 == 0 else inputs
        opt.zero_grad(set_to_none=True)
        with attention():
            loss = fast(*batch)
            loss.backward()
        opt.step()
        return loss

    losses, calls_ms = [], []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(args.steps):
            t = time.perf_counter()
            loss = step()
            losses.append(float(loss))
            calls_ms.append(round((time.perf_counter() - t) * 1e3, 1))
            del loss
        caught = [str(m.message) for m in w]
    res["calls_ms"] = calls_ms[:4]
    res["compile_phases_s"] = compile_phases()
    res["first_steps_s"] = round(sum(calls_ms[:3]) / 1e3, 2)
    res["losses"] = losses
    res["warnings"] = caught[:5]
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(args.iters):
            step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / args.iters)
    res["step_us"] = round(min(times), 1)
    res["step_us_blocks"] = [round(t, 1) for t in times]
    torch.cuda.synchronize()
    res["reserved"] = torch.cuda.memory_reserved(dev)
    res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
    res["max_allocated"] = torch.cuda.max_memory_allocated(dev)
    res["allocated"] = torch.cuda.memory_allocated(dev)
    res["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if not ours:
        res["graph_bytes"] = ro_pool_bytes(dev)
    if ours:
        rep = apc.report()
        res["graphs"] = rep
        res["arena"] = sum(r.get("arena", 0) for r in rep)
        res["lower_bound"] = sum(r.get("lower_bound", 0) for r in rep)
        res["graph_bytes"] = sum(r.get("graph_bytes", 0) + r.get("input_bytes_outside", 0) for r in rep
                                 if r.get("training") != "backward")
        res["captured"] = bool(rep) and all(r["captured"] for r in rep)
        res["replays"] = sum(r.get("replays", 0) for r in rep)
        res["plain_calls"] = sum(r.get("plain_calls", 0) for r in rep)
        res["stats"] = ap.stats()  # where reserved memory is: arenas, spill in use and cached, segments
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        torch.save(sd, os.path.join(args.save, f"train-{args.model}-{args.mode}.pt"))
    print(json.dumps(res), flush=True)


def ro_pool_bytes(dev):
    """The bytes of CUDAGraph Trees' memory pool on dev (its segments in
    PyTorch's memory snapshot): reduce-overhead's graph memory, with its
    inputs' copies; None where torch does not show it."""
    import torch
    try:
        from torch._inductor import cudagraph_trees
        pool = tuple(cudagraph_trees.get_container(dev.index).tree_manager.cuda_graphs_thread_pool)
    except (AttributeError, ImportError):
        return None
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == pool)


def compile_phases():
    """Seconds spent in each of dynamo's timed compile phases so far (the
    first steps' compile split: AOTAutograd, inductor, autotuning, ...)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {k: round(sum(v), 2) for k, v in compilation_time_metrics.items() if sum(v) >= 0.05}


def same(a, b):
    """Whether two runs' losses are equal; else the first step that differs."""
    if a == b:
        return "True"
    if not a or not b:
        return "-"
    return f"False (step {next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) + 1})"


def summary(path, save):
    rows = {}
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault(r["model"], {})[r["mode"]] = r
    M = 1e6
    print(f"{'model':6} {'LB MB':>8} {'arena/LB':>8} {'graph MB RO/ours':>17} {'reserved MB RO/ours':>20} "
          f"{'allocated MB RO/ours':>21} "
          f"{'peak reserved MB RO/ours':>25} {'step us RO/ours':>18} {'ours/RO':>7} {'first 3 steps s RO/ours':>24} "
          f"{'params equal':>12} {'losses equal':>12}  captured (replays, plain)")
    for m, d in rows.items():
        t, o = d.get("reduce-overhead", {}), d.get("ours", {})
        eq = "-"
        if save:
            import torch
            a, b = (os.path.join(save, f"train-{m}-{k}.pt") for k in ("ours", "reduce-overhead"))
            if os.path.exists(a) and os.path.exists(b):
                sa, sb = torch.load(a), torch.load(b)
                diff = max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa)
                eq = "True" if diff == 0 else f"False ({diff:.1e})"
        lb, ar = o.get("lower_bound"), o.get("arena")
        f = lambda v: f"{v / M:.1f}" if isinstance(v, (int, float)) and v else "-"  # noqa: E731
        ts, os_ = t.get("step_us"), o.get("step_us")
        print(f"{m:6} {f(lb):>8} {(f'{ar / lb:.4f}' if lb else '-'):>8} "
              f"{f(t.get('graph_bytes')) + '/' + f(o.get('graph_bytes')):>17} "
              f"{f(t.get('reserved')) + '/' + f(o.get('reserved')):>20} "
              f"{f(t.get('allocated')) + '/' + f(o.get('allocated')):>21} "
              f"{f(t.get('max_reserved')) + '/' + f(o.get('max_reserved')):>25} {str(ts) + '/' + str(os_):>18} "
              f"{(f'{os_ / ts:.3f}' if ts and os_ else '-'):>7} "
              f"{str(t.get('first_steps_s')) + '/' + str(o.get('first_steps_s')):>24} {eq:>12} "
              f"{same(t.get('losses'), o.get('losses')):>12}  {o.get('captured')} ({o.get('replays')}, "
              f"{o.get('plain_calls')})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ours", "reduce-overhead"])
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--iters", type=int, help="steps per timed block (default: 10; the MLPs 100)")
    p.add_argument("--save", default="/tmp/arenaplan-compile-outputs")
    p.add_argument("--summary")
    a = p.parse_args()
    if a.iters is None:
        a.iters = 100 if a.model in ("mlp", "mlp-last") else 10
    if a.summary:
        summary(a.summary, a.save)
    else:
        run(a)


if __name__ == "__main__":
    main()
