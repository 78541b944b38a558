#!/usr/bin/env python3
"""Training loops as people write them, compiled three ways, compared bit
for bit: arenaplan's backend (``ours``); the same backend with
``options={"capture": False}`` (inductor's code without graphs: the
reference, ``ref``); ``mode="reduce-overhead"`` on PyTorch's allocator
(``ro``). One mode a process (the allocator is process-wide); the loops of
that mode run in turn in it, or one a process.

    python3 bench/torch_train_loops.py --mode ref --out DIR [--loops resnet-bn,accum]
    python3 bench/torch_train_loops.py --summary DIR

Each loop builds a small model from a configuration (random weights, seed
0), runs --steps steps and writes, under DIR, the whole state after them
(parameters, buffers, optimizer state, the CUDA generator's state, the
losses and anything else the loop read, such as evaluation outputs) and a
JSON line: whether every compiled graph is captured, its calls without a
graph, the median step time after the first steps, the reserved memory
(peak and at the end) and, ours, the graphs' memory. The summary compares
every state with the reference's, tensor by tensor, and names the first
group that differs.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

LOOPS = ["resnet-bn", "mlp-dropout", "whole-step", "accum", "gpt2-bf16", "gpt2-fp16-scaler", "bert-clip",
         "train-eval", "zero-keep"]


class Loop:
    """A model, its optimizer and one training step."""

    def __init__(self, name, torch, dev, compile_fn):
        self.name, self.torch, self.dev = name, torch, dev
        nn = torch.nn
        torch.manual_seed(0)
        self.extra = {}  # other values the loop read (evaluation outputs), compared too
        self.scaler = self.sched = None
        self.micro = 1
        g = torch.Generator(device=dev).manual_seed(1)
        attn = contextlib.nullcontext
        if name == "resnet-bn":
            import torchvision
            self.model = _Loss(torchvision.models.resnet18(num_classes=10), "ce").to(dev)
            self.batches = [(torch.randn(16, 3, 64, 64, device=dev, generator=g),
                             torch.randint(0, 10, (16,), device=dev, generator=g)) for _ in range(2)]
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        elif name in ("mlp-dropout", "whole-step", "accum", "zero-keep", "train-eval"):
            layers = [nn.Linear(256, 1024), nn.ReLU()]
            if name in ("mlp-dropout", "train-eval"):
                layers.append(nn.Dropout(0.1))
            if name == "train-eval":
                layers.append(nn.BatchNorm1d(1024))
            layers.append(nn.Linear(1024, 256))
            self.model = _Loss(nn.Sequential(*layers), "square").to(dev)
            n = 4 if name == "accum" else 2
            self.batches = [(torch.randn(64, 256, device=dev, generator=g),) for _ in range(n)]
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            if name == "accum":
                self.micro = 4
        elif name.startswith("gpt2"):
            from transformers import GPT2Config, GPT2LMHeadModel
            cfg = GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=8192, n_positions=256, use_cache=False,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
            self.model = _Loss(GPT2LMHeadModel(cfg), "lm").to(dev)
            self.batches = [(torch.randint(0, 8192, (8, 128), device=dev, generator=g),) for _ in range(2)]
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
            self.amp = torch.bfloat16 if name == "gpt2-bf16" else torch.float16
            if name == "gpt2-fp16-scaler":
                self.scaler = torch.amp.GradScaler("cuda")
        elif name == "bert-clip":
            from transformers import BertConfig, BertForSequenceClassification
            cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                             vocab_size=8192, max_position_embeddings=256, num_labels=3,
                             attn_implementation="sdpa")
            self.model = _Loss(BertForSequenceClassification(cfg), "cls").to(dev)
            mask = torch.ones(8, 128, dtype=torch.long, device=dev)
            mask[:, 100:] = 0
            self.batches = [(torch.randint(0, 8192, (8, 128), device=dev, generator=g), mask,
                             torch.randint(0, 3, (8,), device=dev, generator=g)) for _ in range(2)]
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
            self.sched = torch.optim.lr_scheduler.LinearLR(self.opt, start_factor=1.0, end_factor=0.1,
                                                           total_iters=50)
        else:
            raise SystemExit(f"unknown loop {name}")
        if name.startswith(("gpt2", "bert")):
            from torch.nn.attention import SDPBackend, sdpa_kernel
            attn = lambda: sdpa_kernel(SDPBackend.MATH)  # noqa: E731 - deterministic attention
        self.attn = attn
        self.model.train()
        self.count = 0
        if name == "whole-step":
            model, opt = self.model, self.opt

            def whole(x):
                loss = model(x)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss
            self.whole = compile_fn(whole)
        else:
            self.fast = compile_fn(self.model)

    def step(self):
        torch, name = self.torch, self.name
        self.count += 1
        batch = self.batches[self.count % len(self.batches)]
        if name == "whole-step":
            return self.whole(*batch).detach()
        if name == "train-eval" and self.count % 3 == 0:
            self.model.eval()
            with torch.no_grad():
                self.extra.setdefault("eval", []).append(self.fast(*batch).detach().clone())
            self.model.train()
        self.opt.zero_grad(set_to_none=name != "zero-keep")
        total = None
        for k in range(self.micro):
            mb = self.batches[k] if self.micro > 1 else batch
            with self.attn():
                if name.startswith("gpt2"):
                    with torch.autocast("cuda", dtype=self.amp):
                        loss = self.fast(*mb)
                else:
                    loss = self.fast(*mb)
                loss = loss / self.micro if self.micro > 1 else loss
                # read before the backward (reduce-overhead may overwrite the
                # forward's outputs once its backward runs)
                total = loss.detach().clone() if total is None else total + loss.detach()
                (self.scaler.scale(loss) if self.scaler else loss).backward()
        if name == "bert-clip":
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        if self.sched:
            self.sched.step()
        return total

    def state(self):
        torch = self.torch
        st = {"params": {k: v.detach().cpu() for k, v in self.model.named_parameters()},
              "buffers": {k: v.detach().cpu() for k, v in self.model.named_buffers()},
              "optimizer": _tensors(self.opt.state_dict()["state"]),
              "rng": torch.cuda.get_rng_state(self.dev)}
        if self.scaler:
            st["scaler"] = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in self.scaler.state_dict().items()}
        for k, v in self.extra.items():
            st[k] = [t.cpu() for t in v]
        return st


class _Loss:
    pass


def _make_loss(torch):
    class Loss(torch.nn.Module):
        """The model and its loss, one module (the compiled graph returns the loss)."""

        def __init__(self, m, kind):
            super().__init__()
            self.m, self.kind = m, kind

        def forward(self, *a):
            F = torch.nn.functional
            if self.kind == "ce":
                return F.cross_entropy(self.m(a[0]), a[1])
            if self.kind == "square":
                return self.m(a[0]).square().mean()
            if self.kind == "lm":
                return self.m(input_ids=a[0], labels=a[0]).loss
            return self.m(input_ids=a[0], attention_mask=a[1], labels=a[2]).loss
    return Loss


def _tensors(d, prefix=""):
    """Every tensor of a nested dict, on the host, by a flat key."""
    import torch
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_tensors(v, f"{prefix}{k}."))
        elif torch.is_tensor(v):
            out[f"{prefix}{k}"] = v.detach().cpu()
        else:
            out[f"{prefix}{k}"] = v
    return out


def run(args):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    global _Loss
    _Loss = _make_loss(torch)
    ap = apc = None
    if args.mode in ("ours", "ref"):
        import arenaplan.torch as ap
        import arenaplan.compile as apc
        ap.install()
    dev = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # Deterministic kernels (an embedding's backward sums with atomics
    # otherwise), so that two processes can be compared bit for bit.
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.makedirs(args.out, exist_ok=True)
    if args.mode == "ro":
        compile_fn = lambda f: torch.compile(f, mode="reduce-overhead")  # noqa: E731
    else:
        opts = {"capture": args.mode == "ours"}
        compile_fn = lambda f: torch.compile(f, backend="arenaplan", options=opts)  # noqa: E731
    for name in args.loops.split(","):
        torch._dynamo.reset()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        start = max([r.order for r in apc._runners], default=0) if apc else 0
        res = {"loop": name, "mode": args.mode, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
        losses, ms, err = [], [], None
        if args.where:
            torch.cuda.memory._record_memory_history(max_entries=100000)  # the live blocks' stacks
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                loop = Loop(name, torch, dev, compile_fn)
                for _ in range(args.steps):
                    t = time.perf_counter()
                    loss = loop.step()
                    losses.append(float(loss))
                    torch.cuda.synchronize()
                    ms.append((time.perf_counter() - t) * 1e3)
            except Exception as e:  # noqa: BLE001 - reported in the row
                err = f"{type(e).__name__}: {e}"[:400]
            caught = sorted({str(m.message)[:300] for m in w if "arenaplan" in str(m.message)})
        res["error"] = err
        res["warnings"] = caught[:6]
        res["losses"] = losses
        res["first_steps_s"] = round(sum(ms[:3]) / 1e3, 2)
        later = ms[min(len(ms) - 1, 5):] if ms else []
        res["step_ms"] = round(statistics.median(later), 3) if later else None
        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["reserved"] = torch.cuda.memory_reserved(dev)
        res["segments"] = _segments(torch)  # where the reserved bytes are at rest
        if args.where:
            res["blocks_outside_default"] = _blocks_outside_default(torch)
            torch.cuda.memory._record_memory_history(enabled=None)
        if apc is not None:
            rep = [r.report() for r in sorted(apc._runners, key=lambda r: r.order) if r.order > start]
            res["graphs"] = rep
            if args.mode == "ours":
                # A graph called once (dynamo recompiled the function after
                # its first call) ran its one plain call, as every graph's
                # first call does: it is not counted as left uncaptured.
                live = [r for r in rep if r.get("replays", 0) + r.get("plain_calls", 0) > 1]
                res["captured"] = bool(live) and all(r["captured"] for r in live)
                res["plain_calls"] = sum(max(r.get("plain_calls", 0) - 1, 0) for r in rep)
                res["replays"] = sum(r.get("replays", 0) for r in rep)
                res["graph_bytes"] = sum(r.get("graph_bytes", 0) + r.get("input_bytes_outside", 0) for r in rep
                                         if r.get("training") != "backward")
            apc.reset()
        if args.mode == "ro":
            res["graph_bytes"] = _ro_pool_bytes(torch, dev)
        if err is None:
            st = loop.state()
            st["losses"] = torch.tensor(losses, dtype=torch.float64)
            torch.save(st, os.path.join(args.out, f"state-{name}-{args.mode}.pt"))
        print(json.dumps(res), flush=True)
        loop = None


def _segments(torch):
    """The memory snapshot's segments at rest, largest first: [MiB
    mapped, MiB allocated in it, its pool, its stream], so that a
    difference in reserved memory between modes can be told apart (a
    graph pool, a workspace, the program's tensors)."""
    try:
        snap = torch.cuda.memory_snapshot()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"no snapshot: {type(e).__name__}: {e}"[:200]
    M = 2 ** 20
    rows = []
    for seg in snap:
        alloc = sum(b["size"] for b in seg.get("blocks", ()) if b.get("state") == "active_allocated")
        rows.append([round(seg["total_size"] / M, 2), round(alloc / M, 3), str(seg.get("segment_pool_id")),
                     seg.get("stream")])
    return sorted(rows, key=lambda r: -r[0])


def _blocks_outside_default(torch):
    """The live blocks of segments outside the default pool (graph pools,
    workspaces, pools of calls before a capture) and where each was made:
    [pool, MiB of its segment, bytes, innermost Python frames]."""
    try:
        snap = torch.cuda.memory_snapshot()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"no snapshot: {type(e).__name__}: {e}"[:200]
    rows = []
    for seg in snap:
        pool = tuple(seg.get("segment_pool_id", (0, 0)))
        if pool == (0, 0):
            continue
        for b in seg.get("blocks", ()):
            if b.get("state") != "active_allocated":
                continue
            frames = [f"{os.path.basename(f.get('filename', '?'))}:{f.get('line', 0)}:{f.get('name', '?')}"
                      for f in b.get("frames", []) if f.get("filename", "").endswith(".py")][:5]
            rows.append([str(pool), round(seg["total_size"] / 2 ** 20, 2), b["size"], " < ".join(frames)])
    return rows


def _ro_pool_bytes(torch, dev):
    try:
        from torch._inductor import cudagraph_trees
        pool = tuple(cudagraph_trees.get_container(dev.index).tree_manager.cuda_graphs_thread_pool)
    except (AttributeError, ImportError):
        return None
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == pool)


def _diff(a, b, path=""):
    """The first place two states differ (None where they are equal, bit for bit)."""
    import torch
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(set(a) ^ set(b))[:3]}"
        for k in a:
            d = _diff(a[k], b[k], f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} against {len(b)} values"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if torch.is_tensor(a):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{path}: shape or dtype"
        if not torch.equal(a, b):
            if path == "losses":
                i = int((a != b).nonzero()[0])
                return f"losses from step {i + 1}"
            return path
        return None
    return None if a == b else path


def summary(out):
    import torch
    rows = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".jsonl"):
            for line in open(os.path.join(out, f)):
                if line.startswith("{"):
                    r = json.loads(line)
                    rows.setdefault(r["loop"], {}).setdefault(r["mode"], []).append(r)
    # Several processes of a mode (REPEAT in scripts/gpu-train-loops.sh):
    # the first one's row, with the median of their step times.
    for d in rows.values():
        for mode, rs in list(d.items()):
            # a process that raised timed what ran before the error: no step time
            steps = [r["step_ms"] for r in rs if r.get("step_ms") and not r.get("error")]
            d[mode] = dict(rs[0], step_ms=round(statistics.median(steps), 3) if steps else None,
                           processes=len(rs))

    def state(loop, mode):
        p = os.path.join(out, f"state-{loop}-{mode}.pt")
        return torch.load(p, weights_only=False) if os.path.exists(p) else None

    M = 2 ** 20
    print(f"{'loop':17} {'captured':>8} {'plain':>5} {'ours=ref':>22} {'RO=ref':>10} {'ours=RO':>8} "
          f"{'step ms ours/RO/ref':>22} {'ratio':>6} {'graph MiB ours/RO':>18} {'peak MiB ours/RO':>17}  note")
    for loop in LOOPS:
        d = rows.get(loop)
        if not d:
            continue
        o, r = d.get("ours", {}), d.get("ro", {})
        ref = state(loop, "ref")
        so, sr = state(loop, "ours"), state(loop, "ro")

        def eq(s):
            if s is None or ref is None:
                return "-"
            diff = _diff(s, ref)
            return "yes" if diff is None else f"no: {diff}"[:22]
        ours_ro = "-" if so is None or sr is None else ("yes" if _diff(so, sr) is None else "no")
        f = lambda v: f"{v / M:.0f}" if isinstance(v, (int, float)) and v else "-"  # noqa: E731
        ratio = f"{o['step_ms'] / r['step_ms']:.3f}" if o.get("step_ms") and r.get("step_ms") else "-"
        note = o.get("error") or "; ".join(o.get("warnings", []))[:160]
        print(f"{loop:17} {str(o.get('captured', '-')):>8} {str(o.get('plain_calls', '-')):>5} {eq(so):>22} "
              f"{eq(sr):>10} {ours_ro:>8} {str(o.get('step_ms')) + '/' + str(r.get('step_ms')) + '/' + str(d.get('ref', {}).get('step_ms')):>22} {ratio:>6} "
              f"{f(o.get('graph_bytes')) + '/' + f(r.get('graph_bytes')):>18} "
              f"{f(o.get('max_reserved')) + '/' + f(r.get('max_reserved')):>17}  {note}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ours", "ref", "ro"])
    p.add_argument("--loops", default=",".join(LOOPS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="/tmp/arenaplan-train-loops")
    p.add_argument("--where", action="store_true",
                   help="record where each block is made, and list the live blocks outside the default pool "
                        "at the end of each loop (slower: every allocation's stack)")
    p.add_argument("--summary")
    a = p.parse_args()
    if a.summary:
        summary(a.summary)
    else:
        run(a)


if __name__ == "__main__":
    main()
