#!/usr/bin/env python3
"""torch.compile with arenaplan's backend against mode="reduce-overhead"
(CUDAGraph Trees on PyTorch's allocator), one model and mode a process.

    python3 bench/torch_compile.py --mode reduce-overhead --model vit   # PyTorch's allocator
    python3 bench/torch_compile.py --mode ours --model vit              # arenaplan installed, backend="arenaplan"
    python3 bench/torch_compile.py --summary results.jsonl              # the table

Each run prints one JSON line: graph memory (reduce-overhead: what the
caching allocator still reserves after the graphs are recorded and its
cache emptied, less what it reserved before the first call, so its graph
pool with the inputs' placeholders; ours: every compiled graph's arena
mapped + spill held + copies of inputs held outside the arenas, which
inference graphs plan inside them), the lower bound of the compiled
graphs' recorded runs (ours), the first call's time (compile and a plain
run), the capturing call's time, the step time (CUDA events, the fastest
of 5 blocks of --iters calls), and whether the replayed output equals the
first (plain) call's bit for bit. Outputs are saved under --save so that
the summary compares the two modes bit for bit. Random weights; nothing is
downloaded.
"""
import argparse
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

MODELS = ["tiny", "tiny-dyn", "vit", "bert", "resnet50", "vit-dyn", "llama-decode"]


def build(name, torch, dev):
    """(module, list of inputs: one per call shape)."""
    torch.manual_seed(0)
    if name.startswith("tiny"):
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                                torch.nn.LayerNorm(1024)).to(dev, torch.float16).eval()
        batches = (64, 16, 4) if name == "tiny-dyn" else (64,)
        return m, [torch.randn(b, 1024, device=dev, dtype=torch.float16) for b in batches]
    if name in ("vit", "vit-dyn"):
        import torchvision
        m = torchvision.models.vit_b_16().to(dev, torch.float16).eval()
        batches = (32, 8, 1) if name == "vit-dyn" else (32,)
        return m, [torch.randn(b, 3, 224, 224, device=dev, dtype=torch.float16) for b in batches]
    if name == "resnet50":
        import torchvision
        m = torchvision.models.resnet50().to(dev, torch.float16).eval()
        return m, [torch.randn(64, 3, 224, 224, device=dev, dtype=torch.float16)]
    if name == "bert":
        from transformers import BertConfig, BertModel

        class Bert(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = BertModel(BertConfig(attn_implementation="sdpa"))

            def forward(self, ids):
                return self.m(input_ids=ids).last_hidden_state
        m = Bert().to(dev, torch.float16).eval()
        return m, [torch.randint(0, 30522, (32, 128), device=dev)]
    if name == "llama-decode":
        # Llama-3.2-1B's shapes, 4 of its 16 layers, bf16; a decode step
        # (batch 8, one token) on HF's static KV cache of 1024 positions,
        # written in place at a fixed position (so every call is the same).
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                          num_hidden_layers=4, vocab_size=128256, max_position_embeddings=2048,
                          attn_implementation="sdpa")
        lm = LlamaForCausalLM(cfg).to(dev, torch.bfloat16).eval()
        try:
            cache = StaticCache(config=cfg, max_batch_size=8, max_cache_len=1024, device=dev, dtype=torch.bfloat16)
        except TypeError:
            cache = StaticCache(config=cfg, max_cache_len=1024)

        class Decode(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lm, self.cache = lm, cache
                self.register_buffer("pos", torch.tensor([700], device=dev))

            def forward(self, ids):
                return self.lm(input_ids=ids, past_key_values=self.cache, cache_position=self.pos,
                               position_ids=self.pos.view(1, 1).expand(ids.shape[0], 1), use_cache=True).logits
        return Decode(), [torch.randint(0, 128256, (8, 1), device=dev)]
    raise SystemExit(f"unknown model {name}")


def run(args):
    import torch
    ours = args.mode == "ours"
    if ours:
        import arenaplan.torch as ap
        import arenaplan.compile as apc
        ap.install()
    dev = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    model, inputs = build(args.model, torch, dev)
    with torch.no_grad():  # cuBLAS's handle and default-stream workspace exist before anything is measured
        model(inputs[0])
    if ours:
        fast = torch.compile(model, backend="arenaplan")
    else:
        fast = torch.compile(model, mode="reduce-overhead")
    torch.cuda.synchronize()
    if not ours:
        torch.cuda.empty_cache()
        reserved0 = torch.cuda.memory_reserved(dev)
    else:
        stats0 = ap.stats()
    res = {"model": args.model, "mode": args.mode, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    caught = []
    calls_ms = []
    plain, equal_plain = {}, True
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        for x in inputs:  # first call per shape: compile + a plain run; then the capture; then replays
            for k in range(3):
                t = time.perf_counter()
                out = fast(x)
                torch.cuda.synchronize()
                calls_ms.append(round((time.perf_counter() - t) * 1e3, 1))
                # Copies to the host: a device copy would grow the caching allocator's reserve.
                if k == 0:
                    plain[x.shape[0]] = out.cpu()
                else:
                    equal_plain = equal_plain and bool(torch.equal(out.cpu(), plain[x.shape[0]]))
                del out
        # Mixed shapes, each checked against its plain run.
        for x in inputs * 3:
            out = fast(x)
            equal_plain = equal_plain and bool(torch.equal(out.cpu(), plain[x.shape[0]]))
            del out
        caught = [str(m.message) for m in w]
    res["calls_ms"] = calls_ms
    res["first_call_ms"] = calls_ms[0]
    res["capture_call_ms"] = calls_ms[1]
    res["equal_plain"] = equal_plain
    res["warnings"] = caught[:5]
    x = inputs[0]
    times = []
    with torch.no_grad():
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(args.iters):
                out = fast(x)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1e3 / args.iters)
            del out
        out = fast(x).cpu()
    res["step_us"] = round(min(times), 1)
    res["step_us_blocks"] = [round(t, 1) for t in times]
    torch.cuda.synchronize()
    if ours:
        rep = apc.report()
        res["graphs"] = rep
        res["graph_bytes"] = sum(r.get("graph_bytes", 0) + r.get("input_bytes_outside", 0) for r in rep)
        res["lower_bound"] = sum(r.get("lower_bound", 0) for r in rep)
        res["arena"] = sum(r.get("arena", 0) for r in rep)
        res["captured"] = all(r["captured"] for r in rep) and bool(rep)
        # The allocator's counters before the first call and now (spill
        # growth: the capture stream's cuBLAS workspace, ...).
        res["stats_before"], res["stats_after"] = stats0, ap.stats()
    else:
        torch.cuda.empty_cache()
        res["graph_bytes"] = torch.cuda.memory_reserved(dev) - reserved0
        res["max_reserved_growth"] = torch.cuda.max_memory_reserved(dev) - reserved0
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        torch.save(out, os.path.join(args.save, f"{args.model}-{args.mode}.pt"))
    print(json.dumps(res), flush=True)


def compile_s(r):
    """Seconds of compile + first capture over every shape: each shape's
    first two calls (run() makes three calls a shape)."""
    c = r.get("calls_ms", [])
    return sum(c[i] + c[i + 1] for i in range(0, len(c) - 1, 3)) / 1e3


def summary(path, save):
    rows = {}
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault(r["model"], {})[r["mode"]] = r
    eq = {}
    if save and os.path.isdir(save):
        import torch
        for m in rows:
            a, b = (os.path.join(save, f"{m}-{k}.pt") for k in ("ours", "reduce-overhead"))
            if os.path.exists(a) and os.path.exists(b):
                ta, tb = torch.load(a), torch.load(b)
                eq[m] = (bool(torch.equal(ta, tb)), float((ta.float() - tb.float()).abs().max()))
    M = 1e6
    print(f"{'model':9} {'LB MB':>7} {'arena/LB':>8} {'RO pool MB':>10} {'ours MB':>8} {'(inputs)':>8} {'ours/RO':>7} "
          f"{'step us RO/ours':>16} {'ours/RO':>7} {'compile+capture s (all shapes) RO/ours':>38} {'ours/RO':>7} "
          f"{'=plain RO/ours':>14} {'ours=RO (max diff)':>18}  captured")
    for m, d in rows.items():
        t, o = d.get("reduce-overhead", {}), d.get("ours", {})
        tp, op, lb = t.get("graph_bytes"), o.get("graph_bytes"), o.get("lower_bound")
        ph = sum(g.get("input_bytes_outside", 0) for g in o.get("graphs", []))
        f = lambda v: f"{v / M:.1f}" if isinstance(v, (int, float)) and v else "-"  # noqa: E731
        rat = lambda a, b: f"{a / b:.3f}" if a and b else "-"  # noqa: E731
        ts, os_ = t.get("step_us"), o.get("step_us")
        ct, co = compile_s(t), compile_s(o)
        e = eq.get(m)
        print(f"{m:9} {f(lb):>7} {rat(o.get('arena'), lb):>8} {f(tp):>10} {f(op):>8} {f(ph):>8} {rat(op, tp):>7} "
              f"{str(ts) + '/' + str(os_):>16} {rat(os_, ts):>7} {f'{ct:.1f}/{co:.1f}':>38} {rat(co, ct):>7} "
              f"{str(t.get('equal_plain'))[0] + '/' + str(o.get('equal_plain'))[0]:>14} "
              f"{(str(e[0]) + ' (' + format(e[1], '.2g') + ')') if e else '-':>18}  {o.get('captured')}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ours", "reduce-overhead"])
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--save", default="/tmp/arenaplan-compile-outputs")
    p.add_argument("--summary")
    a = p.parse_args()
    if a.summary:
        summary(a.summary, a.save)
    else:
        run(a)


if __name__ == "__main__":
    main()
