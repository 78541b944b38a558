#!/usr/bin/env python3
"""Why does a graph replay cost what it costs? One model, one allocator,
one process: a plain ``torch.cuda.graph`` capture of the step, its replay
time, per-kernel GPU time over
profiled replays (torch.profiler / CUPTI), and the alignment of the
pointers the step reads.

    python3 bench/torch_replay_diag.py --mode torch --model gpt2-decode-b1
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/torch_replay_diag.py --mode torch ...
    python3 bench/torch_replay_diag.py --mode ours --model gpt2-decode-b1 [--planned]

Prints one JSON line. Compare runs: same kernels at the same durations but a
longer replay means gaps (graph topology, launch); slower kernels mean the
memory the kernels touch.
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch_bridge as tb  # noqa: E402


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--mode", choices=["torch", "ours"], required=True)
    a.add_argument("--model", choices=tb.MODELS, required=True)
    a.add_argument("--planned", action="store_true", help="ours: capture with ap.graph (planned arena) instead of torch.cuda.graph")
    a.add_argument("--stages", action="store_true", help="ours: the plain graph's replay after each stage of ap.graph, done by hand")
    a.add_argument("--graphs", action="store_true", help="the plain graph's replay as more graphs are captured")
    a.add_argument("--keep", action="store_true", help="as --graphs, with graphs captured but not instantiated first")
    a.add_argument("--planned-first", action="store_true",
                   help="ours: ap.graph makes the process's first capture, then a plain one")
    a.add_argument("--eager-blocks", type=int, default=0,
                   help="time this many blocks of 50 eager steps first, as bench/torch_bridge.py does")
    a.add_argument("--new-stream", action="store_true",
                   help="capture the first plain graph on a new stream, warmed up 3 times (as ap.graph does)")
    a.add_argument("--alloc-before", type=int, default=0,
                   help="allocate (and keep) this many MiB as one tensor before the first capture")
    a.add_argument("--iters", type=int, default=200)
    a.add_argument("--tag", default="")
    args = a.parse_args()
    if args.mode == "ours":
        import arenaplan.torch as ap
        ap.install()
    import torch
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    step, _ = tb.build(args.model, torch, dev)
    s = tb.warm_stream(torch, step)
    r = {"model": args.model, "mode": args.mode, "planned": args.planned, "tag": args.tag,
         "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
         "spill_plain": os.environ.get("ARENAPLAN_SPILL_PLAIN", "")}
    from torch.profiler import ProfilerActivity, profile

    def measure(replay, n=20):
        """Replay time, then n profiled replays: GPU busy time, span, and
        where the idle gaps fall (summed by the op that follows them)."""
        for _ in range(20):
            replay()
        torch.cuda.synchronize()
        m = {"replay_us": tb.timed(torch, replay, args.iters, blocks=7)}
        # Host side: what one launch costs the calling thread, and whether
        # some thread of the process burns CPU while Python sleeps.
        import time as _t
        torch.cuda.synchronize()
        t0 = _t.perf_counter()
        for _ in range(50):
            replay()
        m["launch_host_us"] = (_t.perf_counter() - t0) / 50 * 1e6
        torch.cuda.synchronize()
        c0, w0 = _t.process_time(), _t.perf_counter()
        _t.sleep(0.5)
        m["idle_cpu_pct"] = 100 * (_t.process_time() - c0) / (_t.perf_counter() - w0)
        m["threads"] = int(next(l for l in open("/proc/self/status") if l.startswith("Threads:")).split()[1])
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                replay()
            torch.cuda.synchronize()
        ev = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda x: x[0])
        per = collections.defaultdict(lambda: [0, 0.0])
        gaps = collections.defaultdict(float)
        ops = len(ev) // n if ev else 0
        first_gap = 0.0
        for i, (t0, t1, name) in enumerate(ev):
            per[name][0] += 1
            per[name][1] += t1 - t0
            if i:
                g = max(0.0, t0 - ev[i - 1][1])
                if ops and i % ops == 0:
                    first_gap += g
                else:
                    gaps[name[:70]] += g
        m["ops"] = len(ev) / n
        m["busy_us"] = sum(t1 - t0 for t0, t1, _ in ev) / n
        m["span_us"] = (ev[-1][1] - ev[0][0]) / n if ev else 0
        m["gap_between_replays_us"] = first_gap / max(1, n - 1)
        m["gap_inside_us"] = sum(gaps.values()) / n
        m["top_gaps"] = [[k, round(v / n, 2)] for k, v in sorted(gaps.items(), key=lambda kv: -kv[1])[:8]]
        m["top"] = [[k[:90], v[0] // n, round(v[1] / n, 2)] for k, v in sorted(per.items(), key=lambda kv: -kv[1][1])[:12]]
        return m

    def plain(stream, keep=False):
        g = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            out = step()
        torch.cuda.synchronize()
        g._keep = out
        return g

    runs = {}
    keep_alive = []
    if args.eager_blocks:
        r["eager_us"] = tb.timed(torch, step, 50, blocks=args.eager_blocks)
    if args.alloc_before:
        keep_alive.append(torch.empty(args.alloc_before << 20, dtype=torch.uint8, device=dev))
    if args.planned_first:
        gs = ap.graph(step)
        r["planned_first_captures"] = gs.report()["captures"]
        runs["planned, the first capture"] = measure(gs.replay)
        ga = plain(s)
        runs["plain, the second"] = measure(ga.replay)
        runs["planned again"] = measure(gs.replay)
        r["runs"] = runs
        r["replay_us"] = runs["planned, the first capture"]["replay_us"]
        print(json.dumps(r), flush=True)
        return
    if args.new_stream:
        s = tb.warm_stream(torch, step)
    ga = plain(s)
    runs["plain"] = measure(ga.replay)
    if args.planned:
        # One process, in order: does ap.graph's graph replay slower, or
        # does the process replay every graph slower after ap.graph?
        gs = ap.graph(step)
        runs["planned"] = measure(gs.replay)
        runs["plain again"] = measure(ga.replay)
        runs["plain on the step's stream"] = measure(plain(gs.stream).replay)
    if args.graphs:
        # Does the count of instantiated graphs change a graph's replay,
        # whatever the allocator?
        s2 = torch.cuda.Stream()
        s2.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s2):
            step()
        torch.cuda.synchronize()
        gb = plain(s2)
        runs["after a 2nd graph (kept), other stream"] = measure(ga.replay)
        gc = plain(s2)
        runs["after a 3rd graph (kept)"] = measure(ga.replay)
        gb.reset()
        gc.reset()
        torch.cuda.synchronize()
        runs["after destroying both"] = measure(ga.replay)
        gd = plain(s)
        runs["after a 2nd graph on the same stream"] = measure(ga.replay)
    if args.keep:
        # The same with graphs captured but never instantiated
        # (CUDAGraph(keep_graph=True), no instantiate()).
        s2 = torch.cuda.Stream()
        s2.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s2):
            step()
        torch.cuda.synchronize()
        kept = [plain(s2, keep=True) for _ in range(4)]
        runs["after 4 captures never instantiated"] = measure(ga.replay)
        gb = plain(s2)
        runs["then a 2nd instantiated graph"] = measure(ga.replay)
        gc = plain(s2)
        runs["then a 3rd instantiated graph"] = measure(ga.replay)
    if args.stages:
        import arenaplan.torch as apt
        lib = apt._need()
        st2 = torch.cuda.Stream()
        apt._warm_up(step, st2, 3)
        runs["after warm-up on a new stream"] = measure(ga.replay)
        big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        runs["after a 1 GiB spill allocation"] = measure(ga.replay)
        del big
        sid = lib.step_new(0, "diag")
        g0 = torch.cuda.CUDAGraph()
        o = apt._capture(lib, sid, step, st2, g0, lambda: lib.step_record(sid, st2.cuda_stream))
        del o
        g0.reset()
        runs["after the recording capture"] = measure(ga.replay)
        lib.step_plan(sid, 1.0)
        runs["after planning (arena mapped)"] = measure(ga.replay)
        gp = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gp, stream=st2):
            op = step()
        torch.cuda.synchronize()
        runs["after a plain capture on that stream"] = measure(ga.replay)
        sid2 = lib.step_new(0, "diag2")
        g2 = torch.cuda.CUDAGraph()
        o2 = apt._capture(lib, sid2, step, st2, g2, lambda: lib.step_record(sid2, st2.cuda_stream))
        del o2
        g2.reset()
        lib.step_plan(sid2, 1.0)
        lib.step_close(sid2)
        torch.cuda.synchronize()
        runs["after a 2nd recording, plan, close"] = measure(ga.replay)
        lib.step_serve(sid, st2.cuda_stream, False)
        o3 = step()  # an eager run served from the plan, no capture
        del o3
        lib.step_end(sid, False)
        torch.cuda.synchronize()
        runs["after an eager served run"] = measure(ga.replay)
        g1 = torch.cuda.CUDAGraph()
        o1 = apt._capture(lib, sid, step, st2, g1, lambda: lib.step_serve(sid, st2.cuda_stream, False))
        torch.cuda.synchronize()
        runs["after the serving capture"] = measure(ga.replay)
        runs["the served graph"] = measure(g1.replay)
        del o1
        g1.reset()
        lib.step_close(sid)
        torch.cuda.synchronize()
        runs["after closing the step"] = measure(ga.replay)
    r["runs"] = runs
    r.update({k: runs["plain"][k] for k in ("replay_us",)})
    # Alignment of the parameters and buffers the step reads.
    ptrs = []
    import gc
    for o in gc.get_objects():
        try:
            if torch.is_tensor(o) and o.is_cuda:
                ptrs.append(o.data_ptr())
        except Exception:
            pass
    r["tensors"] = len(ptrs)
    for k in (16, 128, 256, 512, 4096, 2 << 20):
        r[f"aligned_{k}"] = sum(1 for p in ptrs if p % k == 0)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
