#!/usr/bin/env python3
"""Hugging Face ``generate`` with a static cache, unmodified, three ways: with
arenaplan installed (``ours``: the ``mode="reduce-overhead"`` compile that
``generate`` makes by itself lands on arenaplan's backend), on PyTorch's
allocator with that same reduce-overhead compile (``ro``), and without a
compile (``eager``: ``generate``'s dynamic cache), and on PyTorch's
allocator with ``generate``'s compile in inductor's default mode, without
graphs (``plain``: the same kernels as ours, what the tokens of ours and of
reduce-overhead are compared with where they differ). One mode a process
(the allocator is process-wide).

    python3 bench/torch_hf_generate.py --mode ours --model llama --new 64
    python3 bench/torch_hf_generate.py --summary results.jsonl

Models from configurations (random weights, seed 0): a GPT-2-style and a
Llama-style decoder. Calls: greedy at batch 2 with prompts of 24 and then 40
tokens, then sampling (seed 1) at 24; each call's tokens are written under
--out so that the summary compares them between modes. Prints one JSON
line: ms per new token (median of --reps timed greedy calls after the
first ones), the first call's seconds (compile and capture; with
--profile, its cProfile by cumulative time under --out, and the timed
calls' by own time, which then include the profiler's cost), the reserved
memory at its peak and at the end, and ours: the backend's report (graphs
routed here, captured, calls without a graph).
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def build(name, torch, dev):
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=6, n_head=8, n_embd=512, vocab_size=32000, n_positions=1024)
        return GPT2LMHeadModel(cfg).to(dev, torch.bfloat16).eval()
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(num_hidden_layers=6, hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                          num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024)
        return LlamaForCausalLM(cfg).to(dev, torch.bfloat16).eval()
    raise SystemExit(f"unknown model {name}")


def run(args):
    import torch
    ap = apc = None
    if args.mode == "ours":
        import arenaplan.torch as ap
        ap.install()
    if args.mode == "plain":
        compile_ = torch.compile

        def plain_compile(*a, **k):  # generate's reduce-overhead compile, without CUDA graphs
            if k.get("mode") == "reduce-overhead":
                k["mode"] = None
            return compile_(*a, **k)
        torch.compile = plain_compile
    in_compiled = _time_compiled(torch)
    dev = torch.device("cuda", 0)
    model = build(args.model, torch, dev)
    g = torch.Generator(device=dev).manual_seed(2)
    prompts = {n: torch.randint(0, 32000, (2, n), device=dev, generator=g) for n in (24, 40)}
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, pad_token_id=0)
    if args.mode != "eager":
        kw["cache_implementation"] = "static"
    res = {"model": args.model, "mode": args.mode, "new": args.new, "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__}
    tokens = {}
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        prof = None
        if args.profile:
            import cProfile
            prof = cProfile.Profile()
        t = time.perf_counter()
        if prof is not None:
            prof.enable()
        tokens["greedy24"] = model.generate(prompts[24], do_sample=False, **kw).cpu()
        torch.cuda.synchronize()
        if prof is not None:
            prof.disable()
        res["first_call_s"] = round(time.perf_counter() - t, 2)
        if prof is not None:
            _write_profile(prof, os.path.join(args.out, f"profile-{args.model}-{args.new}-{args.mode}.txt"))
        tokens["greedy40"] = model.generate(prompts[40], do_sample=False, **kw).cpu()
        torch.manual_seed(1)
        tokens["sample24"] = model.generate(prompts[24], do_sample=True, top_k=50, **kw).cpu()
        times = []
        if prof is not None:
            prof = cProfile.Profile()
        # capture_ms: each member's last; allocs: the allocations a call made
        # (PyTorch's count); go_calls: ours' allocator calls into Go
        # (allocations the C fast path did not serve, and frees sent alone).
        split = {"cpu_ms": [], "thread_ms": [], "captures": [], "capture_ms": [], "allocs": [], "go_calls": [], "compiled_ms": [], "compiled_calls": []}
        for _ in range(args.reps):
            torch.cuda.synchronize()
            before = _graph_totals(ap)
            a0, g0 = _alloc_counts(torch, ap)
            s0, n0 = in_compiled["s"], in_compiled["n"]
            in_compiled["events"] = [] if args.gpu_time else None
            c0, h0 = time.process_time(), time.thread_time()
            t = time.perf_counter()
            if prof is not None:
                prof.enable()
            out = model.generate(prompts[24], do_sample=False, **kw)
            torch.cuda.synchronize()
            if prof is not None:
                prof.disable()
            times.append((time.perf_counter() - t) * 1e3 / args.new)
            # Where a call's time goes: the whole process's CPU (every
            # thread) against the calling thread's, and ours' captures.
            split["cpu_ms"].append(round((time.process_time() - c0) * 1e3, 1))
            split["thread_ms"].append(round((time.thread_time() - h0) * 1e3, 1))
            after = _graph_totals(ap)
            split["captures"].append(after[0] - before[0])
            split["capture_ms"].append(round(after[1], 1))
            a1, g1 = _alloc_counts(torch, ap)
            split["allocs"].append(a1 - a0)
            split["go_calls"].append(g1 - g0)
            split["compiled_ms"].append(round((in_compiled["s"] - s0) * 1e3, 1))
            split["compiled_calls"].append(in_compiled["n"] - n0)
            if in_compiled["events"] is not None:  # the device time between each compiled call's start and end
                split.setdefault("compiled_gpu_ms", []).append(
                    round(sum(a.elapsed_time(b) for a, b in in_compiled["events"]), 2))
                in_compiled["events"] = None
            del out
        res["call_split"] = split
        if args.alloc_sites:
            _alloc_sites(torch, lambda: model.generate(prompts[24], do_sample=False, **kw),
                         os.path.join(args.out, f"alloc-sites-{args.model}-{args.new}-{args.mode}.txt"))
        if prof is not None:
            _write_profile(prof, os.path.join(args.out, f"profile-{args.model}-{args.new}-{args.mode}-timed.txt"),
                           "tottime")
        res["warnings"] = sorted({str(m.message)[:200] for m in w if "arenaplan" in str(m.message)})[:5]
    res["ms_per_token"] = round(statistics.median(times), 3)
    res["call_ms"] = [round(t * args.new, 1) for t in times]  # each timed call, in order
    res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
    res["reserved"] = torch.cuda.memory_reserved(dev)
    if ap is not None:
        import arenaplan.compile as apc
        rep = apc.report()
        res["graphs"] = rep
        res["routed"] = sum(1 for r in rep if r.get("from_mode"))
        res["captured"] = bool(rep) and all(r.get("captures", 0) > 0 for r in rep if r.get("replays", 0) + r.get("plain_calls", 0) > 1)
        res["plain_calls"] = sum(r.get("plain_calls", 0) for r in rep)
    os.makedirs(args.out, exist_ok=True)
    torch.save(tokens, os.path.join(args.out, f"tokens-{args.model}-{args.new}-{args.mode}.pt"))
    print(json.dumps(res), flush=True)


def _alloc_sites(torch, call, path):
    """Where one more call allocates: its memory history's allocations
    counted by size and the innermost Python frames, most frequent first."""
    import collections
    torch.cuda.memory._record_memory_history(max_entries=200000)
    call()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    sites = collections.Counter()
    for trace in snap.get("device_traces", []):
        for e in trace:
            if e.get("action") != "alloc":
                continue
            frames = [f"{os.path.basename(f.get('filename', '?'))}:{f.get('line', 0)}:{f.get('name', '?')}"
                      for f in e.get("frames", []) if f.get("filename", "").endswith(".py")][:4]
            sites[(e.get("size", 0), " < ".join(frames))] += 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path.replace(".txt", ".trace"), "w") as f:  # the call's events in order: action, address, size, stream
        for trace in snap.get("device_traces", []):
            for e in trace:
                f.write(f"{e.get('action')} {e.get('addr', 0)} {e.get('size', 0)} {e.get('stream', 0)}\n")
    with open(path, "w") as f:
        f.write(f"{sum(sites.values())} allocations\n")
        for (size, where), n in sites.most_common(60):
            f.write(f"{n:6d} {size:>10d}  {where}\n")


def _time_compiled(torch):
    """Wrap what torch.compile returns (after any mode's own wrapping) so
    that the host time spent inside compiled calls is summed: a call's time
    split into the compiled forward's (the graph launch and the backend's
    wrapper) and the rest of generate's (eager ops, the allocator)."""
    acc = {"s": 0.0, "n": 0, "events": None}  # events: a list to append (start, end) CUDA events to
    compile_ = torch.compile

    def timed_compile(*a, **k):
        f = compile_(*a, **k)

        def call(*x, **y):
            ev = acc["events"]
            if ev is not None:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t = time.perf_counter()
            try:
                return f(*x, **y)
            finally:
                acc["s"] += time.perf_counter() - t
                acc["n"] += 1
                if ev is not None:
                    e1.record()
                    ev.append((e0, e1))
        return call
    torch.compile = timed_compile
    return acc


def _alloc_counts(torch, ap):
    """Allocations made so far on device 0, and ours' allocator calls into
    Go (0 on PyTorch's allocator)."""
    n = torch.cuda.memory_stats(0).get("allocation.all.allocated", 0)
    if ap is None:
        return n, 0
    fp = ap.stats(0)["FastPath"]
    return n, fp["GoAllocs"] + fp["FreeCalls"]


def _graph_totals(ap):
    """Captures made so far by the backend's graphs, and the milliseconds
    of each member's last capture, summed (0, 0 on PyTorch's allocator)."""
    if ap is None:
        return 0, 0.0
    import arenaplan.compile as apc
    rep = apc.report()
    return sum(r.get("captures", 0) for r in rep), sum(r.get("capture_ms", 0.0) for r in rep)


def _write_profile(prof, path, order="cumulative"):
    """A profile: the first call's by cumulative time, where its seconds go
    (dynamo, AOTAutograd, inductor's cache, the captures); the timed
    calls' by own time, where a token's host time goes."""
    import io
    import pstats
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf).sort_stats(order)
    st.print_stats(60)
    # Where the backends differ: arenaplan's and CUDAGraph Trees' code,
    # AOTAutograd and its cache, inductor's compile and its caches.
    st.print_stats("arenaplan|cudagraph|compile_fx|aot_autograd|autograd_cache|codecache|output_code", 80)
    with open(path, "w") as f:
        f.write(buf.getvalue())


def summary(path, out):
    """The table of a results file: per model, tokens and mode, the median
    of its processes' ms per token (their count in brackets: processes of
    one mode differ by up to 50% on a host-bound step), the range of their
    first calls, memory, the host time in the compiled calls and ours'
    calls into Go a call, and the report from the last process of each."""
    rows = {}
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault((r["model"], r["new"]), {}).setdefault(r["mode"], []).append(r)
    M = 2 ** 20
    print(f"{'model':6} {'new':>4} {'ms/token ours/RO/eager (processes)':>36} {'first call s ours/RO':>21} "
          f"{'peak MiB ours/RO':>17} {'rest MiB ours/RO':>17} {'tokens = RO':>11} {'= plain':>8} {'RO = plain':>10}"
          f" {'compiled ms/call ours/RO':>24} {'Go calls/call':>13}  routed, captured")
    for (m, n), d in sorted(rows.items()):
        o, r = (d.get(k, [{}])[-1] for k in ("ours", "ro"))

        def per_token(mode):
            v = [x["ms_per_token"] for x in d.get(mode, []) if x.get("ms_per_token") is not None]
            return f"{statistics.median(v):.3g}({len(v)})" if v else "-"

        def first(mode):
            v = sorted(x["first_call_s"] for x in d.get(mode, []) if x.get("first_call_s") is not None)
            return "-" if not v else f"{v[0]}" if v[0] == v[-1] else f"{v[0]}-{v[-1]}"

        def same(a, b):
            pa, pb = (os.path.join(out, f"tokens-{m}-{n}-{k}.pt") for k in (a, b))
            if not (os.path.exists(pa) and os.path.exists(pb)):
                return "-"
            import torch
            ta, tb = torch.load(pa), torch.load(pb)
            return "yes" if all(torch.equal(ta[k], tb[k]) for k in ta) else "no"
        f = lambda v: f"{v / M:.0f}" if v else "-"  # noqa: E731

        def split(mode, key):
            """The median over a mode's processes and timed calls of a
            call_split figure, the first timed call left out (it may
            capture)."""
            v = [y for x in d.get(mode, []) for y in x.get("call_split", {}).get(key, [])[1:]]
            return f"{statistics.median(v):.3g}" if v else "-"
        print(f"{m:6} {n:>4} {per_token('ours') + '/' + per_token('ro') + '/' + per_token('eager'):>36} "
              f"{first('ours') + '/' + first('ro'):>21} "
              f"{f(o.get('max_reserved')) + '/' + f(r.get('max_reserved')):>17} "
              f"{f(o.get('reserved')) + '/' + f(r.get('reserved')):>17} {same('ours', 'ro'):>11} "
              f"{same('ours', 'plain'):>8} {same('ro', 'plain'):>10} "
              f"{split('ours', 'compiled_ms') + '/' + split('ro', 'compiled_ms'):>24} {split('ours', 'go_calls'):>13}  "
              f"{o.get('routed')}, {o.get('captured')} ({o.get('plain_calls')} plain)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ours", "ro", "eager", "plain"])
    p.add_argument("--model", choices=["gpt2", "llama"], default="llama")
    p.add_argument("--new", type=int, default=64, help="new tokens a call")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="/tmp/arenaplan-hf-generate")
    p.add_argument("--profile", action="store_true", help="write the first call's cProfile under --out")
    p.add_argument("--alloc-sites", action="store_true",
                   help="after the timed calls, write one more call's allocations by size and Python frames under --out")
    p.add_argument("--gpu-time", action="store_true",
                   help="time each compiled call on the device too (CUDA events around it)")
    p.add_argument("--summary")
    a = p.parse_args()
    if a.summary:
        summary(a.summary, a.out)
    else:
        run(a)


if __name__ == "__main__":
    main()
