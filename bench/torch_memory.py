#!/usr/bin/env python3
"""Does installing arenaplan ever raise a program's memory, at any moment?
Each workload runs once per mode, one process each (the allocator is
process-wide), and the whole process's memory is measured against PyTorch
at its best:

- ``ours``: arenaplan installed (``arenaplan.torch.install()`` before CUDA
  starts); compiled workloads on ``torch.compile(backend="arenaplan")``,
  the batch-size family on ``arenaplan.torch.graphs``, the eager workload
  as it is.
- ``ro``: PyTorch's allocator; ``torch.compile(mode="reduce-overhead")``
  (CUDAGraph Trees), the family as ``torch.cuda.graph`` captures sharing
  one pool (largest first, as vLLM captures them), the eager workload as
  it is.
- ``plain``: PyTorch's allocator and ``torch.compile`` without graphs
  (compiled workloads only; the others print nothing).

    python3 bench/torch_memory.py --mode ours --workload gpt2-prefill   # one JSON line
    python3 bench/torch_memory.py --summary results.jsonl               # the table

A process records the device memory the CUDA context takes (total less
free after torch.cuda.init()), builds the workload (a model from a
configuration, random weights, seed 0), times its first 3 steps together
(compile, warm-up and capture) with the reserved bytes after each, then
runs --steps more (the step time: the median of the last 25). Then: the
peak reserved (max_memory_reserved); the reserved at rest (after the steps
and a gc.collect(), the cache not emptied); the device memory in use at
rest beyond the context (what nvidia-smi shows); memory_stats()'s reserved
bytes, which must equal memory_reserved(); the graphs' memory (ours: arenas
mapped + spill held + copies of inputs held outside them; ro: CUDAGraph
Trees' pool, or the family's shared pool) and, ours, the largest lower
bound of a graph (the least memory its step can run in) and arenaplan's
counters. The summary puts ours' peak and reserve at rest over the least of
the PyTorch modes'. Nothing is downloaded.
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

COMPILED = ["gpt2-prefill", "convnext", "bert3", "t5enc", "breaks", "resnet18-train", "llama-train"]
WORKLOADS = COMPILED + ["graphs", "sleep", "eager"]
BATCHES = (256, 64, 16, 1)  # the family's members, largest first
M = 2 ** 20


def _make_wrap(torch):
    class Wrap(torch.nn.Module):
        """A model and what a step takes of it, one module (the compiled
        graph returns one tensor: a loss, logits or hidden states)."""

        def __init__(self, m, kind):
            super().__init__()
            self.m, self.kind = m, kind

        def forward(self, *a):
            if self.kind == "ce":
                return torch.nn.functional.cross_entropy(self.m(a[0]), a[1])
            if self.kind == "lm":
                return self.m(input_ids=a[0], labels=a[0]).loss
            if self.kind == "logits":
                return self.m(input_ids=a[0]).logits
            return self.m(input_ids=a[0]).last_hidden_state
    return Wrap


def build(name, mode, torch, dev, ap, info):
    """The workload's step, a function of no arguments (its first calls
    compile and capture). The family writes its graphs' memory into info."""
    torch.manual_seed(0)
    if name in ("graphs", "sleep"):
        return _family(mode, torch, dev, ap, info, sleep=name == "sleep")
    Wrap = _make_wrap(torch)

    def compile_fn(m):
        # bert3: one graph per batch size (without dynamic=False the second
        # size would recompile with dynamic shapes)
        kw = {"dynamic": False} if name == "bert3" else {}
        if mode == "ours":
            return torch.compile(m, backend="arenaplan", **kw)
        if mode == "ro":
            return torch.compile(m, mode="reduce-overhead", **kw)
        return torch.compile(m, **kw)

    def ids(*shape):
        return torch.randint(0, 16384, shape, device=dev)

    if name == "breaks":
        return _breaks(torch, dev, compile_fn)
    if name in ("gpt2-prefill", "convnext", "bert3", "t5enc"):
        if name == "gpt2-prefill":
            from transformers import GPT2Config, GPT2LMHeadModel
            cfg = GPT2Config(n_layer=6, n_head=8, n_embd=512, vocab_size=16384, n_positions=1024, use_cache=False,
                             attn_implementation="sdpa")
            m, xs = Wrap(GPT2LMHeadModel(cfg), "logits"), [ids(4, 512)]
        elif name == "convnext":
            import torchvision
            m = torchvision.models.convnext_tiny()
            xs = [torch.randn(32, 3, 224, 224, device=dev, dtype=torch.float16)]
        elif name == "bert3":
            from transformers import BertConfig, BertModel
            cfg = BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
                             vocab_size=16384, attn_implementation="sdpa")
            m, xs = Wrap(BertModel(cfg), "hidden"), [ids(b, 128) for b in (32, 8, 1)]
        else:
            from transformers import T5Config, T5EncoderModel
            cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=16384)
            m, xs = Wrap(T5EncoderModel(cfg), "hidden"), [ids(16, 256)]
        fast = compile_fn(m.to(dev, torch.float16).eval())

        def step():
            with torch.no_grad():
                for x in xs:
                    fast(x)
        return step
    if name == "resnet18-train":
        import torchvision
        m = Wrap(torchvision.models.resnet18(num_classes=100), "ce").to(dev)
        batch = (torch.randn(32, 3, 128, 128, device=dev), torch.randint(0, 100, (32,), device=dev))
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    elif name == "llama-train":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=8, vocab_size=16384, max_position_embeddings=512,
                          attn_implementation="sdpa")
        m, batch = Wrap(LlamaForCausalLM(cfg), "lm").to(dev), (ids(8, 256),)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    elif name == "eager":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=4, n_head=8, n_embd=512, vocab_size=16384, n_positions=1024, use_cache=False,
                         attn_implementation="sdpa")
        m, batch = Wrap(GPT2LMHeadModel(cfg), "lm").to(dev), (ids(8, 256),)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    else:
        raise SystemExit(f"unknown workload {name}")
    m.train()
    fast = m if name == "eager" else compile_fn(m)

    def step():
        opt.zero_grad(set_to_none=True)
        fast(*batch).backward()
        opt.step()
    return step


def _breaks(torch, dev, compile_fn):
    """Graphs of different frames, run one after another on one stream: a
    6-block transformer (512 wide, fp16, batch 4 x 512) whose forward
    breaks the graph after its third block, then a head compiled as a
    module of its own, the hidden states flowing from each into the next.
    (Dynamo, meeting the break inside the loop over blocks, compiles the
    block's forward as a frame of its own, called with each block's
    parameters: six members of one graph, then the head's.)"""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, w, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(w), nn.LayerNorm(w)
            self.qkv, self.o = nn.Linear(w, 3 * w), nn.Linear(w, w)
            self.up, self.down = nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

        def forward(self, x):
            b, t, w = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w)
            x = x + self.o(a)
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16384, 512)
            self.blocks = nn.ModuleList(Block(512, 8) for _ in range(6))

        def forward(self, ids):
            h = self.emb(ids)
            for i, blk in enumerate(self.blocks):
                if i == 3:
                    torch._dynamo.graph_break()
                h = blk(h)
            return h

    body = compile_fn(Body().to(dev, torch.float16).eval())
    head = compile_fn(nn.Sequential(nn.LayerNorm(512), nn.Linear(512, 16384)).to(dev, torch.float16).eval())
    x = torch.randint(0, 16384, (4, 512), device=dev)

    def step():
        with torch.no_grad():
            head(body(x))
    return step


def _family(mode, torch, dev, ap, info, sleep=False):
    """An MLP captured at every batch size of BATCHES; a step replays each
    once. The first step captures. sleep: ours puts the weights in a
    region backed up to the host and ends each step with a sleep and a
    wake of everything (arenaplan.torch.pause(), resume()), noting the
    device memory in use while asleep (``asleep_used``, beyond the
    context); PyTorch, which has no sleep, runs the same steps awake."""
    nn = torch.nn
    weights = ap.region("weights", backup=True) if sleep and mode == "ours" else contextlib.nullcontext()
    with weights:
        mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev, torch.float16).eval()
    xs = {b: torch.randn(b, 1024, device=dev, dtype=torch.float16) for b in BATCHES}
    fns = {b: (lambda x=xs[b]: mlp(x)) for b in BATCHES}  # each reads its static input
    replay, held = {}, {}

    def capture():
        if mode == "ours":
            fam = held["family"] = ap.graphs(fns, warmup=2)
            replay.update({b: (lambda b=b: fam.replay(b)) for b in BATCHES})
            rep = fam.report()
            info.update(graphs=[rep], captured=True, graph_bytes=rep["graph_bytes"], arena=rep["arena"],
                        largest_need=rep["lower_bound"])
            return
        # As PyTorch's CUDA graphs documentation does: warm-up runs on a side
        # stream (two, as ap.graphs makes), then the captures on it.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for fn in fns.values():
                for _ in range(2):
                    fn()
        torch.cuda.current_stream().wait_stream(s)
        # torch.cuda.graph empties the cache as it starts: so here first, so
        # that what the captures add to the reserve is the pool's.
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        r0 = torch.cuda.memory_reserved(dev)
        pool, outs = torch.cuda.graph_pool_handle(), {}
        for b, fn in fns.items():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=s):
                outs[b] = fn()  # static outputs, kept as a program keeps them
            replay[b] = g.replay
        held["outputs"] = outs
        torch.cuda.synchronize()
        info["graph_bytes"] = torch.cuda.memory_reserved(dev) - r0

    def step():
        with torch.no_grad():
            if not replay:
                capture()
            for b in BATCHES:
                replay[b]()
        if sleep and mode == "ours":
            ap.pause()
            free, total = torch.cuda.mem_get_info(dev)
            info["asleep_used"] = max(info.get("asleep_used", 0), total - free - info["base_used"])
            ap.resume()
    return step


def run(a):
    if a.mode == "plain" and a.workload not in COMPILED:
        return  # nothing compiled without graphs to compare with: no row
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    ap = apc = None
    if a.mode == "ours":
        import arenaplan.torch as ap
        import arenaplan.compile as apc  # registers the backend "arenaplan"
        ap.install()
    torch.cuda.init()
    dev = torch.device("cuda", 0)
    free, total = torch.cuda.mem_get_info(dev)
    base = total - free  # the CUDA context
    torch.cuda.reset_peak_memory_stats(dev)
    if a.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200000)
    res = {"workload": a.workload, "mode": a.mode, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "base_used": base}
    info, ms, first, err = {"base_used": base}, [], [], None
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            step = build(a.workload, a.mode, torch, dev, ap, info)
            torch.cuda.synchronize()
            res["built_reserved"] = torch.cuda.memory_reserved(dev)
            for k in range(3 + a.steps):
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                ms.append((time.perf_counter() - t) * 1e3)
                if k < 3:
                    first.append(torch.cuda.memory_reserved(dev))
                if k == 2 and a.snapshot:
                    torch.cuda.memory._dump_snapshot(a.snapshot)
                    torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as e:  # noqa: BLE001 - reported in the row
            err = f"{type(e).__name__}: {e}"[:400]
        caught = sorted({str(m.message)[:300] for m in w if "arenaplan" in str(m.message)})
    res["warnings"] = caught[:6]
    res["first_steps_reserved"] = first
    res["first_steps_s"] = round(sum(ms[:3]) / 1e3, 2) if len(ms) >= 3 else None
    later = ms[3:][-25:]
    res["step_ms"] = round(statistics.median(later), 3) if later else None
    try:
        gc.collect()
        torch.cuda.synchronize()
        res["peak_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["rest_reserved"] = torch.cuda.memory_reserved(dev)
        res["stats_reserved"] = torch.cuda.memory_stats(dev).get("reserved_bytes.all.current")
        free, total = torch.cuda.mem_get_info(dev)
        res["rest_used"] = total - free - base  # what nvidia-smi shows beyond the context
        if apc is not None and a.workload in COMPILED:
            rep = apc.report()
            res["graphs"] = rep
            res["captured"] = bool(rep) and all(r["captured"] for r in rep)
            # A training graph's placeholders are reported by its forward
            # and its backward: counted once.
            res["graph_bytes"] = sum(r.get("graph_bytes", 0) + r.get("input_bytes_outside", 0) for r in rep
                                     if r.get("training") != "backward")
            res["largest_need"] = max((r["lower_bound"] for r in rep if "lower_bound" in r), default=None)
        if a.mode == "ro" and a.workload in COMPILED:
            from torch_train_loops import _ro_pool_bytes  # CUDAGraph Trees' pool, measured as there
            res["graph_bytes"] = _ro_pool_bytes(torch, dev)
        res.update(info)
        if ap is not None:
            res["arenaplan_stats"] = ap.stats()
    except Exception as e:  # noqa: BLE001 - reported in the row
        err = err or f"{type(e).__name__}: {e}"[:400]
    res["error"] = err
    print(json.dumps(res, default=str), flush=True)


def summary(path):
    rows = {}
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault(r["workload"], {}).setdefault(r["mode"], []).append(r)
    dash = "–"

    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def mib(v):
        return f"{v / M:.0f}" if num(v) else dash

    print("| workload | peak MiB ours / ro / plain | at rest MiB ours / ro / plain | peak ours ÷ PyTorch's least "
          "| at rest ours ÷ PyTorch's least | nvidia-smi at rest MiB ours / ro | first 3 steps s ours / ro "
          "| step ms ours / ro | graph MiB ours / ro pool | largest need MiB (ours) | stats agree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for w in WORKLOADS + sorted(set(rows) - set(WORKLOADS)):
        d = rows.get(w)
        if not d:
            continue
        for mode, rs in d.items():
            notes += [f"- {w} {mode}: {r['error']}" for r in rs if r.get("error")]
        ours = d.get("ours", [])
        notes += [f"- {w} ours: not every graph captured" for r in ours
                  if r.get("captured") is False and not r.get("error")]
        notes += [f"- {w} ours: device memory in use while asleep {mib(r['asleep_used'])} MiB beyond the context "
                  f"(awake, at rest: {mib(r.get('rest_used'))})" for r in ours if num(r.get("asleep_used"))]
        last = {mode: rs[-1] for mode, rs in d.items()}  # a later run's row replaces an earlier one
        o = last.get("ours", {})

        def cells(key, modes, f=mib):
            # a mode that raised did not run the program: its figure is marked, and no peer
            return " / ".join(f(last.get(mode, {}).get(key)) + (" (raised)" if last.get(mode, {}).get("error") else "")
                              for mode in modes)

        def ratio(key):
            least = [last[m][key] for m in ("ro", "plain")
                     if m in last and num(last[m].get(key)) and not last[m].get("error")]
            if not num(o.get(key)) or not least or min(least) <= 0:
                return dash
            return f"{o[key] / min(least):.3f}"
        secs = lambda v: f"{v:.1f}" if num(v) else dash  # noqa: E731
        step = lambda v: f"{v:.2f}" if num(v) else dash  # noqa: E731
        agree = dash
        if ours:
            agree = "yes" if all(num(r.get("rest_reserved")) and r.get("stats_reserved") == r["rest_reserved"]
                                 for r in ours) else "no"
        print(f"| {w} | {cells('peak_reserved', ('ours', 'ro', 'plain'))} "
              f"| {cells('rest_reserved', ('ours', 'ro', 'plain'))} | {ratio('peak_reserved')} "
              f"| {ratio('rest_reserved')} | {cells('rest_used', ('ours', 'ro'))} "
              f"| {cells('first_steps_s', ('ours', 'ro'), secs)} | {cells('step_ms', ('ours', 'ro'), step)} "
              f"| {cells('graph_bytes', ('ours', 'ro'))} | {mib(o.get('largest_need'))} | {agree} |")
    if notes:
        print("\nerrors and notes:")
        print("\n".join(notes))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ours", "ro", "plain"])
    p.add_argument("--workload", choices=WORKLOADS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--snapshot", metavar="PATH",
                   help="record the memory history from the start through the first three steps and dump a "
                        "snapshot there (torch.cuda.memory._dump_snapshot; open it in memory_viz)")
    p.add_argument("--summary")
    a = p.parse_args()
    if a.summary:
        summary(a.summary)
    elif a.mode and a.workload:
        run(a)
    else:
        p.error("--mode and --workload, or --summary")


if __name__ == "__main__":
    main()
