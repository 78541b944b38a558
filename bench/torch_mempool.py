#!/usr/bin/env python3
"""torch.cuda.MemPool with a pluggable allocator, arenaplan installed (GPU).

    python3 bench/torch_mempool.py [--so PATH]

The pool is made as torch_memory_saver's "torch" mode and vLLM's sleep mode
make theirs: ``CUDAPluggableAllocator(so, "vmm_malloc", "vmm_free")`` over
bench/vmm_pool_alloc.c (built here with gcc unless --so is given: every
allocation its own cuMemCreate + cuMemMap, and its own vmm_pause /
vmm_resume that release the physical memory and map new memory at the same
addresses), ``MemPool(alloc._allocator)`` and ``use_mem_pool``. Checks, with
arenaplan as PyTorch's allocator:

- tensors made inside the block live in that allocator's memory (as
  segments: many small tensors share one), tensors made outside or by
  other threads do not;
- pause gives the device memory back (mem_get_info), resume maps it at the
  same addresses; contents restored from a host copy (as torch_memory_saver
  with CPU backup does) are bit for bit the same, and a CUDA graph
  captured before the pause that reads them replays the same output;
- freeing tensors returns their blocks to the pool (no call to the
  allocator while the pool lives); deleting the pool gives every segment
  back to vmm_free, at once for free segments, at the last free for others.

Prints a table and one JSON line; exits 1 if a check fails.
"""
import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def build_so() -> str:
    out = os.path.join(tempfile.mkdtemp(prefix="vmm_pool_"), "vmm_pool_alloc.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", out, os.path.join(HERE, "vmm_pool_alloc.c"),
                    "-ldl", "-lpthread"], check=True)
    return out


def main() -> int:
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--so", help="a built vmm_pool_alloc.so (default: build it with gcc)")
    args = ap_.parse_args()
    so = args.so or build_so()

    import torch
    import arenaplan.torch as ap
    ap.install()
    if "arenaplan" not in getattr(torch.cuda.MemPool, "__module__", ""):
        from arenaplan import _mempool  # until arenaplan.torch.install() calls it itself
        _mempool.install(ap._lib, torch)

    vmm = ctypes.CDLL(so)
    vmm.vmm_pause.restype = vmm.vmm_resume.restype = ctypes.c_longlong
    vmm.vmm_owns.restype, vmm.vmm_owns.argtypes = ctypes.c_int, [ctypes.c_size_t, ctypes.c_size_t]

    def counts():
        c = (ctypes.c_longlong * 7)()
        vmm.vmm_counts(c)
        return dict(zip(["allocs", "frees", "live", "live_bytes", "pauses", "resumes", "last_err"], c))

    rows, ok_all = [], True

    def check(name, value, ok):
        nonlocal ok_all
        ok_all &= bool(ok)
        rows.append((name, str(value), "ok" if ok else "FAIL"))

    dev = torch.device("cuda", 0)
    torch.ones(1, device=dev)  # CUDA starts
    alloc = torch.cuda.memory.CUDAPluggableAllocator(so, "vmm_malloc", "vmm_free")
    pool = torch.cuda.MemPool(alloc._allocator)
    check("MemPool(CUDAPluggableAllocator._allocator)", f"id {pool.id}", True)

    g = torch.Generator(device=dev).manual_seed(0)
    shapes = [(64,)] * 40 + [(1024, 1024)] * 3 + [(4096, 4096)]  # 256 B .. 64 MiB (fp32)
    outside_thread = []
    t0 = time.perf_counter()
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.randn(s, device=dev, generator=g) for s in shapes]
        w = torch.randn(2048, 2048, device=dev, generator=g)
        x = torch.randn(2048, 256, device=dev, generator=g)
        th = threading.Thread(target=lambda: outside_thread.append(torch.empty(1 << 20, device=dev)))
        th.start()
        th.join()
    t_pool = time.perf_counter() - t0
    outside = torch.empty(1 << 20, device=dev)
    c0 = counts()
    inside = all(vmm.vmm_owns(t.data_ptr(), t.numel() * t.element_size()) for t in ts + [w, x])
    check("tensors made in use_mem_pool are in the allocator's memory", f"{len(ts) + 2} tensors", inside)
    check("segments asked of the allocator", f"{c0['allocs']} for {len(ts) + 2} tensors",
          0 < c0["allocs"] < len(ts) + 2)
    check("tensors made outside, or by another thread, are not",
          "", not vmm.vmm_owns(outside.data_ptr(), 1) and not vmm.vmm_owns(outside_thread[0].data_ptr(), 1))

    # A graph captured before the pause reads the pool's tensors.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = w @ x
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = w @ x
    graph.replay()
    torch.cuda.synchronize()
    y_before = y.clone()
    host = [t.cpu() for t in ts + [w, x]]
    ptrs = [t.data_ptr() for t in ts + [w, x]]

    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    t1 = time.perf_counter()
    released = vmm.vmm_pause()
    t_pause = time.perf_counter() - t1
    free1, _ = torch.cuda.mem_get_info()
    check("vmm_pause gives the memory back", f"{released / 2**20:.0f} MiB released, free +{(free1 - free0) / 2**20:.0f} MiB",
          released > 0 and free1 - free0 >= released * 0.9)
    t2 = time.perf_counter()
    mapped = vmm.vmm_resume()
    t_resume = time.perf_counter() - t2
    free2, _ = torch.cuda.mem_get_info()
    check("vmm_resume maps it back", f"{mapped / 2**20:.0f} MiB, free {(free2 - free1) / 2**20:+.0f} MiB",
          mapped == released and free1 - free2 >= mapped * 0.9)
    for t, h in zip(ts + [w, x], host):
        t.copy_(h)
    same = all(t.data_ptr() == p for t, p in zip(ts + [w, x], ptrs)) and all(
        torch.equal(t.cpu(), h) for t, h in zip(ts + [w, x], host))
    check("same addresses, contents restored bit for bit", "", same)
    graph.replay()
    torch.cuda.synchronize()
    check("graph captured before the pause replays the same", "", torch.equal(y, y_before))

    # Frees go back to the pool, not to the allocator.
    del ts
    gc.collect()
    c1 = counts()
    check("freed tensors return to the pool (allocator not called)", f"frees {c1['frees']}", c1["frees"] == 0)
    with torch.cuda.use_mem_pool(pool):
        again = torch.empty(64, device=dev)
    c2 = counts()
    check("the pool reuses freed blocks", f"allocs {c0['allocs']} -> {c2['allocs']}", c2["allocs"] == c0["allocs"])
    # Deleting the pool: free segments go back now, the rest at their last free.
    del pool
    gc.collect()
    c3 = counts()
    busy = c3["live"]
    del again, w, x, y, y_before, graph, t
    gc.collect()
    torch.cuda.synchronize()
    c4 = counts()
    check("deleting the pool gives every segment back", f"{c3['frees']} at delete, {c4['frees']} after the last tensor; live {c4['live']}",
          c4["live"] == 0 and c4["frees"] == c4["allocs"] and busy > 0)

    # Cost of an allocation + free inside and outside a pool (fast path shut inside).
    pool2 = torch.cuda.MemPool(alloc._allocator)
    n = 20000

    def cost():
        t = time.perf_counter()
        for _ in range(n):
            torch.empty(1024, device=dev)
        return (time.perf_counter() - t) / n * 1e6

    cost()
    out_us = cost()
    with torch.cuda.use_mem_pool(pool2):
        cost()
        in_us = cost()
    check("torch.empty(1024)+free, µs: outside / inside use_mem_pool", f"{out_us:.2f} / {in_us:.2f}", True)
    del pool2
    gc.collect()

    width = max(len(r[0]) for r in rows)
    print(f"{'check':<{width}}  {'value':<50}  verdict")
    for name, value, verdict in rows:
        print(f"{name:<{width}}  {value:<50}  {verdict}")
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "ok": ok_all,
                      "pause_ms": t_pause * 1e3, "resume_ms": t_resume * 1e3, "make_tensors_ms": t_pool * 1e3,
                      "alloc_free_us_outside": out_us, "alloc_free_us_inside": in_us, "counts": counts()}))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
