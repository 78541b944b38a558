#!/usr/bin/env python3
"""PyTorch's memory tooling with arenaplan installed, against PyTorch's own
allocator running the same program in another process: statistics,
snapshots and memory_viz, and real libraries that call them (transformers'
Trainer with memory metrics, Lightning's DeviceStatsMonitor, a vLLM-style
start-up profile, a torchtitan-style memory monitor), and torch.compile's
CUDAGraph Trees refused at the call.

    python3 bench/torch_compat.py                  # both allocators, a table last
    python3 bench/torch_compat.py --mode ours      # one process: one JSON line a check

Random weights; nothing is downloaded.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

MiB = 1 << 20


def checks(torch, mode, out):
    """Runs every check, calling out(name, ok, value) for each."""
    dev = torch.device("cuda", 0)

    def check(name):
        def run(fn):
            try:
                v = fn()
                out(name, True, v)
            except Exception as e:  # noqa: BLE001 - reported per check
                out(name, False, f"{type(e).__name__}: {str(e)[:200]}")
        return run

    torch.manual_seed(0)
    # A fixed program: a small transformer's forward and backward.
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192)).to(dev)
    ids = torch.randint(0, 8192, (8, 256), device=dev)

    def step():
        loss = model(ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    step()

    @check("memory_allocated / max_memory_allocated after reset_peak")
    def _():
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        return {"current_mib": round(torch.cuda.memory_allocated() / MiB, 2),
                "step_peak_mib": round((torch.cuda.max_memory_allocated() - before) / MiB, 2)}

    @check("memory_reserved / max_memory_reserved")
    def _():
        return {"reserved_mib": round(torch.cuda.memory_reserved() / MiB, 1),
                "peak_mib": round(torch.cuda.max_memory_reserved() / MiB, 1)}

    @check("memory_stats (keys)")
    def _():
        st = torch.cuda.memory_stats()
        return {"keys": len(st), "num_ooms": st["num_ooms"], "allocation.all.current": st["allocation.all.current"]}

    @check("memory_summary")
    def _():
        return {"lines": len(torch.cuda.memory_summary().splitlines())}

    @check("reset_accumulated_memory_stats")
    def _():
        torch.cuda.reset_accumulated_memory_stats()
        return {"allocation.all.allocated": torch.cuda.memory_stats()["allocation.all.allocated"]}

    @check("torch.accelerator.memory_stats")
    def _():
        acc = getattr(torch, "accelerator", None)
        if acc is None or not hasattr(acc, "memory_stats"):
            return "absent in this torch"
        return {"allocated_bytes.all.current_mib": round(acc.memory_stats(0)["allocated_bytes.all.current"] / MiB, 2)}

    @check("_record_memory_history + _snapshot + _dump_snapshot + memory_viz")
    def _():
        torch.cuda.memory._record_memory_history(max_entries=100000)
        step()
        snap = torch.cuda.memory._snapshot()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snap.pickle")
            torch.cuda.memory._dump_snapshot(path)
            size = os.path.getsize(path)
            if os.environ.get("SNAPSHOT_OUT"):
                import shutil
                shutil.copy(path, f"{os.environ['SNAPSHOT_OUT']}-{mode}.pickle")
        torch.cuda.memory._record_memory_history(enabled=None)
        from torch.cuda import _memory_viz
        html = _memory_viz.trace_plot(snap)
        segs = _memory_viz.segment_plot(snap)
        traces = sum(len(t) for t in snap["device_traces"])
        return {"segments": len(snap["segments"]), "trace_entries": traces, "pickle_kib": size // 1024,
                "trace_plot_kib": len(html) // 1024, "segment_plot_kib": len(segs) // 1024}

    @check("memory_snapshot")
    def _():
        return {"segments": len(torch.cuda.memory_snapshot())}

    @check("vLLM-style start-up profile")
    def _():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_stats(dev).get("allocated_bytes.all.current", 0)
        with torch.no_grad():
            model(torch.randint(0, 8192, (32, 512), device=dev))
        torch.cuda.synchronize()
        peak = torch.cuda.memory_stats(dev).get("allocated_bytes.all.peak", 0)
        free, total = torch.cuda.mem_get_info()
        kv = int(total * 0.9) - peak
        return {"profile_peak_mib": round((peak - base) / MiB, 2), "kv_cache_gib": round(kv / (1 << 30), 3)}

    @check("torchtitan-style memory monitor")
    def _():
        torch.cuda.reset_peak_memory_stats()
        step()
        st = torch.cuda.memory_stats(dev)
        return {"active_peak_mib": round(st["active_bytes.all.peak"] / MiB, 2),
                "reserved_peak_mib": round(st["reserved_bytes.all.peak"] / MiB, 1),
                "retries": st["num_alloc_retries"], "ooms": st["num_ooms"]}

    @check("transformers Trainer, skip_memory_metrics=False")
    def _():
        from transformers import Trainer, TrainingArguments
        data = [{"input_ids": ids[i % 8].cpu(), "labels": ids[i % 8].cpu()} for i in range(32)]
        with tempfile.TemporaryDirectory() as d:
            args = TrainingArguments(d, per_device_train_batch_size=8, max_steps=4, report_to=[],
                                     skip_memory_metrics=False, logging_steps=100, save_strategy="no")
            res = Trainer(model=model, args=args, train_dataset=data).train()
        return {k: v for k, v in res.metrics.items() if "mem_gpu" in k}

    @check("Lightning Trainer + DeviceStatsMonitor")
    def _():
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import DeviceStatsMonitor
        from lightning.pytorch.loggers import CSVLogger

        class M(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(256, 256)

            def training_step(self, batch, _):
                return self.lin(batch).square().mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        loader = torch.utils.data.DataLoader(torch.randn(64, 256), batch_size=16)
        with tempfile.TemporaryDirectory() as d:
            log = CSVLogger(d)
            tr = pl.Trainer(max_steps=4, accelerator="gpu", devices=1, callbacks=[DeviceStatsMonitor()],
                            logger=log, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, log_every_n_steps=1)
            tr.fit(M(), loader)
            log.save()
            import csv
            with open(os.path.join(log.log_dir, "metrics.csv")) as f:
                rows = list(csv.DictReader(f))
        cols = [k for k in (rows[0] if rows else {}) if "allocated_bytes.all.current" in k]
        vals = [float(r[cols[0]]) for r in rows if cols and r.get(cols[0])]
        return {"rows": len(rows), "stat_columns": len([k for k in (rows[0] if rows else {}) if "bytes" in k]),
                "allocated_mib_last": round(vals[-1] / MiB, 2) if vals else None}

    @check("torch.compile(mode='reduce-overhead')")
    def _():
        t0 = time.perf_counter()
        f = torch.compile(torch.nn.Linear(64, 64).to(dev), mode="reduce-overhead")
        y = f(torch.randn(8, 64, device=dev))
        y = f(torch.randn(8, 64, device=dev))
        return {"ran": True, "seconds": round(time.perf_counter() - t0, 2)}


def one(mode):
    if mode == "ours":
        import arenaplan.torch as ap
        ap.install()
    import torch

    def out(name, ok, value):
        print(json.dumps({"mode": mode, "check": name, "ok": ok, "value": value}), flush=True)

    try:
        checks(torch, mode, out)
    except Exception:  # noqa: BLE001
        out("program", False, traceback.format_exc()[-400:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["torch", "ours"])
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.mode:
        return one(args.mode)
    rows = {}
    for mode in ("torch", "ours"):
        pr = subprocess.run([sys.executable, __file__, "--mode", mode], capture_output=True, text=True, timeout=500)
        for line in pr.stdout.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            rows.setdefault(r["check"], {})[mode] = r
            if args.json_out:
                with open(args.json_out, "a") as f:
                    f.write(line + "\n")
        if pr.returncode:
            print(f"{mode}: exit {pr.returncode}: {pr.stderr.strip().splitlines()[-3:]}")
    print("\n| call | PyTorch's allocator | arenaplan |")
    print("| --- | --- | --- |")
    for name, r in rows.items():
        cell = lambda m: ("ok " if r[m]["ok"] else "FAIL ") + json.dumps(r[m]["value"]) if m in r else "-"  # noqa: E731
        print(f"| {name} | {cell('torch')} | {cell('ours')} |")


if __name__ == "__main__":
    main()
