"""One step captured on a planned arena: :func:`graph` and :class:`Graph`,
and the capture helpers families and eager steps share."""
from __future__ import annotations

import contextlib
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Optional

import torch

from . import _state
from ._lib import ArenaplanError, Library

class Graph:
    """A step captured once on a planned arena; :meth:`replay` runs it.

    Its outputs (what the step returned) live at fixed addresses in the
    arena: every replay overwrites them, as with ``torch.cuda.graph``.
    Clone what must survive the next replay. Inputs are whatever tensors
    the step read during capture: copy new data into them before replay.
    """

    def __init__(self, lib: Library, sid: int, cuda_graph: "torch.cuda.CUDAGraph", outputs: Any,
                 stream: "torch.cuda.Stream", capture_ms: float, record_ms: float, plan_ms: float,
                 device: int = 0):
        self._lib, self._sid, self._graph = lib, sid, cuda_graph
        self._device = device
        self.outputs = outputs
        self.stream = stream
        self.capture_ms, self.record_ms, self.plan_ms = capture_ms, record_ms, plan_ms
        self.captures = 1  # captures made, the recording one included
        self.served_capture_ms = capture_ms

    def replay(self) -> Any:
        """Replay the captured step on the current stream; returns its
        outputs (the same tensors every time). Costs one graph launch, and
        a read of the library's pause generation (a call into it after a
        pause or resume). Raises :class:`ArenaplanError` after
        :meth:`close` and while the graphs' memory of its device is paused."""
        if self._graph is None:
            raise ArenaplanError(f"arenaplan: replay of a closed graph (step {self._sid})")
        if self._lib.graphs_paused(self._device):
            raise ArenaplanError(f"arenaplan: the graphs' memory of device {self._device} is paused: "
                                 "arenaplan.torch.resume() first")
        self._graph.replay()
        return self.outputs

    def report(self) -> dict:
        """The plan against the lower bound and the memory the graph holds:
        ``arena`` (planned bytes), ``lower_bound`` (the peak of live
        bytes), ``bound`` (the strongest lower bound the planner proved)
        and ``stop`` (why its search ended), ``ratio``, ``spill_held``
        (allocations the plan did not serve during capture), ``divergences``
        and the first one's reason, plus capture timings in ms. PyTorch's
        own pool for the same step can only be measured without arenaplan
        installed (another process): see bench/torch_bridge.py."""
        r = self._lib.step_report(self._sid)
        r.update(capture_ms=self.capture_ms, record_ms=self.record_ms, plan_build_ms=self.plan_ms,
                 captures=self.captures, served_capture_ms=self.served_capture_ms, graph_bytes=r["arena_mapped"] + r["spill_held"])
        return r

    def save(self, path: str) -> None:
        """Write the step's checked plan to a plan file (zstd, checksummed)."""
        self._lib.step_save(self._sid, path)

    def close(self) -> None:
        """Destroy the CUDA graph and give its memory back (the arena once
        the outputs are freed)."""
        if self._graph is not None:
            self._graph.reset()
            self._graph = None
            self.outputs = None
            self._lib.step_close(self._sid)


def _warm_up(fn: Callable[[], Any], stream: "torch.cuda.Stream", n: int) -> Optional["torch.dtype"]:
    """n eager runs of fn on stream; returns the dtype of the last one's
    outputs (see :func:`_product_dtype`)."""
    dtype = None
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        for k in range(n):
            out = fn()
            if k == n - 1:
                dtype = _product_dtype(out)
            del out
    torch.cuda.current_stream(stream.device).wait_stream(stream)
    torch.cuda.synchronize(stream.device)
    return dtype


def _product_dtype(out: Any) -> Optional["torch.dtype"]:
    """The dtype of the largest floating-point tensor among a step's
    outputs, where it is one cuBLASLt multiplies in (half, bfloat16,
    float32): the dtype the step's matrix products most likely ran in.
    None without one."""
    from torch.utils import _pytree
    best, most = None, -1
    for x in _pytree.tree_leaves(out):
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16, torch.float32) \
                and x.numel() > most:
            best, most = x.dtype, x.numel()
    return best


def warm_up_first(fn: Callable[[], Any], stream: "torch.cuda.Stream", n: int, device: int) -> float:
    """The warm-up of the first step on a new capture stream, with the
    stream's workspaces made around it: as :func:`capture_stream` does,
    but the cuBLASLt workspace is made after the n runs, by a product in
    the dtype of their outputs (float32 without a run or a floating-point
    output). A product's first run in a dtype loads that dtype's kernels:
    50–130 ms on an H200 where the process has not multiplied in that
    dtype yet, 4–5 ms where it has (an fp32 product in a bf16 program,
    or the reverse, against one in the program's own dtype). The runs
    make their own cuBLASLt workspace (1 MiB) outside the pool, dropped
    when the pool's is made; the cuBLAS workspace (32 MiB on a Hopper
    GPU) is made in the pool first, without a product. Returns the
    milliseconds spent making workspaces."""
    t = time.perf_counter()
    workspaces(stream, device, lt=False)
    torch.cuda.empty_cache()
    ms = (time.perf_counter() - t) * 1e3
    dtype = _warm_up(fn, stream, n)
    t = time.perf_counter()
    workspaces(stream, device, dtype)
    return ms + (time.perf_counter() - t) * 1e3


@contextlib.contextmanager
def _run(lib: Library, sid: int) -> Iterator[None]:
    """Ends the step's run underway when the block ends: failed if it
    raised (an out-of-memory error then names what arenaplan holds)."""
    try:
        yield
    except RuntimeError as e:
        lib.step_end(sid, True)
        _raise_oom(e)
    except BaseException:
        lib.step_end(sid, True)
        raise
    lib.step_end(sid, False)


def _record_eager(lib: Library, sid: int, fn: Callable[[], Any], stream: "torch.cuda.Stream") -> None:
    """One eager run of fn on stream, its allocations recorded for the plan
    (outputs live to the end of the step, as under capture)."""
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        lib.step_record(sid, stream.cuda_stream)
        with _run(lib, sid):
            out = fn()
        del out
    torch.cuda.current_stream(stream.device).wait_stream(stream)
    torch.cuda.synchronize(stream.device)


def _serve_capture(lib: Library, sid: int, fn: Callable[[], Any], stream: "torch.cuda.Stream", strict: bool,
                   replan_budget: Optional[float]) -> tuple:
    """Capture fn served from the step's plan. With replan_budget (the plan
    came from an eager run), a capture that diverged from the plan (code
    that tests whether it is being captured makes other allocations) is
    thrown away, its own allocations planned, and the step captured again.
    Returns (graph, outputs, captures made)."""
    serve = lambda: lib.step_serve(sid, stream.cuda_stream, strict)  # noqa: E731
    _capture_parts.clear()  # this step's served captures only
    g = torch.cuda.CUDAGraph()
    out = _capture(lib, sid, fn, stream, g, serve)
    if replan_budget is None or lib.step_report(sid)["last_run_divergences"] == 0:
        return g, out, 1
    del out
    g.reset()
    try:
        lib.step_replan(sid, replan_budget)
    except ArenaplanError as e:
        # A family member whose capture needs more than the family arena
        # (or a step whose outputs someone still holds) keeps its plan: its
        # capture spills what the plan does not serve.
        warnings.warn(f"arenaplan: the capture allocated differently from the recorded run and was not "
                      f"planned again ({e}); the plan stays and what it does not serve spills")
    g = torch.cuda.CUDAGraph()
    out = _capture(lib, sid, fn, stream, g, serve)
    return g, out, 2


def capture_stream(device: int, stream: Optional["torch.cuda.Stream"] = None) -> "torch.cuda.Stream":
    """stream (default: a new one on device), its math libraries' workspaces
    made: cuBLAS and cuBLASLt make one per stream at its first matrix
    product and keep it. Made inside a capture, such a workspace is an
    allocation its recording lacked, kept for good: it would take a planned
    buffer out of its turn, and a later capture planned over that range
    would write where every matrix product on the stream works.

    Then the blocks cached free go back to the device (``empty_cache``,
    as ``torch.cuda.graph`` does as it begins): the runs before a capture
    allocate on the capture stream, whose free lists are not the
    program's stream's, so what the program's own calls left cached (a
    compiled graph's first, plain call; the workspaces just dropped)
    would otherwise stay mapped beside them, and a process's peak would
    be that cache plus the capture's runs."""
    if stream is None:
        stream = torch.cuda.Stream(device=device)
    workspaces(stream, device)
    torch.cuda.empty_cache()
    return stream


def workspaces(stream: "torch.cuda.Stream", device: int, dtype: Optional["torch.dtype"] = None,
               lt: bool = True) -> None:
    """Make the calling thread's cuBLAS and cuBLASLt workspaces on stream
    (PyTorch keeps one per handle, and so per thread, and stream), as
    :func:`capture_stream` does: a capture in another thread (a backward,
    in autograd's) would otherwise make them inside the capture.

    They are made in a pool of the stream's that is never released (see
    :func:`_workspace_pool`), after PyTorch's workspaces are dropped
    (:func:`release_workspaces`), as CUDAGraph Trees make theirs in their
    pool around each recording: the threads that capture on one stream
    (a forward in the program's, its backward in autograd's) then take
    turns on one workspace's memory instead of holding one each (32 MiB
    each on a Hopper GPU), which is safe because graphs captured on one
    stream run in turn; and a graph keeps its workspace's address, which
    a program may drop at any time (``torch._C._cuda_clearCublasWorkspaces()``:
    CUDAGraph Trees around each warm-up and recording, Lightning at
    teardown, checkpointing tools). Freed into this pool, that memory only
    ever goes to this stream's workspaces again, never to other tensors
    while a graph still writes there.

    Dropping PyTorch's workspaces drops every thread's: a thread whose
    workspaces another thread's call dropped makes them again with
    :func:`ensure_workspaces` before it multiplies on the stream again.

    The cuBLAS workspace comes with the stream's cuBLAS handle, no product
    run; the cuBLASLt one with a product in ``dtype`` (default: the last
    one given, float32 before; see :func:`warm_up_first` for why the dtype
    matters). ``lt=False``:
    the cuBLAS workspace only, and the thread's workspaces not noted as
    made."""
    pool = _workspace_pool(stream, device)
    with _ws_lock, contextlib.ExitStack() as stack:
        release_workspaces()
        _ws_made.clear()
        if pool is not None:
            stack.enter_context(torch.cuda.use_mem_pool(pool, device=device))
        stack.enter_context(torch.cuda.stream(stream))
        torch.cuda.current_blas_handle()  # cuBLAS: the handle gets its workspace on the current stream
        if lt:
            global _lt_dtype
            _lt_dtype = dtype or _lt_dtype
            a = torch.ones(8, 8, device=torch.device("cuda", device), dtype=_lt_dtype or torch.float32)
            torch.addmm(a[0], a, a)  # cuBLASLt (a bias)
            del a
            _ws_made.add((threading.get_ident(), device, stream.cuda_stream))
    stream.synchronize()


def ensure_workspaces(stream: "torch.cuda.Stream", device: int) -> None:
    """:func:`workspaces`, unless the calling thread's on stream are the
    ones made last: another thread's call dropped them (a backward's
    capture, in autograd's thread, drops the forward's), and the thread's
    next matrix product on the stream would make them anew outside their
    pool (the memory history of a training loop with an evaluation
    forward: 32 MiB more at its peak, where a later drop would free a
    workspace that captured graphs still write in to other tensors)."""
    if (threading.get_ident(), device, stream.cuda_stream) not in _ws_made:
        workspaces(stream, device)


# (thread, device, stream) whose workspaces were made in their pool since
# PyTorch's were last dropped; _ws_lock orders the drop and the making.
_ws_made: set = set()
_ws_lock = threading.Lock()
_lt_dtype: Optional["torch.dtype"] = None  # the cuBLASLt products' dtype, once a step's outputs told it


_ws_pools: dict = {}


def _workspace_pool(stream: "torch.cuda.Stream", device: int) -> Optional[Any]:
    """The pool of a capture stream's math-library workspaces (arenaplan's
    ``torch.cuda.MemPool`` for graph memory: its segments are laid out
    beside the small arenas, sharing physical memory with them, as CUDA
    graphs on PyTorch's allocator keep workspaces and tensors in one pool;
    kept for the process's life, as a graph may be), or None where
    arenaplan's pools are not installed."""
    key = (device, stream.cuda_stream)
    pool = _ws_pools.get(key)
    if pool is None:
        mp = getattr(torch.cuda, "MemPool", None)
        if getattr(mp, "__module__", "") != "arenaplan._mempool":
            return None
        pool = _ws_pools.setdefault(key, mp(_graph_memory=True))
    return pool


def release_workspaces() -> None:
    """Drop PyTorch's cuBLAS and cuBLASLt workspaces (every thread's and
    stream's), as CUDAGraph Trees do around a warm-up (:func:`workspaces`
    does, before each capture): those the program's plain calls made
    would otherwise stay held (32 MiB each on a Hopper GPU), while the
    graphs' own stay in their pool. The program's next matrix product
    makes its stream's again. Nothing where this torch cannot."""
    clear = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _capture(lib: Library, sid: int, fn: Callable[[], Any], stream: "torch.cuda.Stream",
             g: "torch.cuda.CUDAGraph", begin: Callable[[], None], mode: str = "global") -> Any:
    """One capture of fn on stream, the step's run begun (begin: record or
    serve) and joined once the capture has begun, so that what
    CUDAGraph.capture_begin allocates on the stream (the generators'
    per-capture seed and offset, made in a process's first capture) is
    not the step's; End(failed) always, after the capture ended. mode:
    torch.cuda.graph's capture_error_mode ("thread_local" for a capture
    inside autograd's backward, where other threads may use CUDA)."""
    begun = False
    t0 = time.perf_counter()
    try:
        with torch.cuda.graph(g, stream=stream, capture_error_mode=mode):
            t1 = time.perf_counter()
            begin()
            begun = True
            lib.step_join_capture(sid)
            out = fn()
            t2 = time.perf_counter()
    except RuntimeError as e:
        if begun:
            lib.step_end(sid, True)
        _raise_oom(e)
    except BaseException:
        if begun:
            lib.step_end(sid, True)
        raise
    lib.step_end(sid, False)
    t3 = time.perf_counter()
    # Where a capture's time goes: torch.cuda.graph's entry (it
    # synchronizes, collects garbage and empties the cache), the step's
    # Python run, and the capture's end (instantiation).
    _capture_parts.append([round((t1 - t0) * 1e3, 2), round((t2 - t1) * 1e3, 2), round((t3 - t2) * 1e3, 2)])
    return out


_capture_parts: list = []  # [entry, step, end] ms of the served captures of the last _serve_capture


def _recording_graph() -> "torch.cuda.CUDAGraph":
    """A graph for the throwaway recording capture: captured, never
    instantiated (keep_graph, torch >= 2.6), which saves the instantiation."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return torch.cuda.CUDAGraph()


_RECORD = ("auto", "eager", "capture")


def _check_record(record: str, warmup: int) -> bool:
    """Whether the plan is recorded from the last warm-up run (eagerly)."""
    if record not in _RECORD:
        raise ArenaplanError(f"arenaplan: record={record!r}: want one of {_RECORD}")
    if record == "eager" and warmup < 1:
        raise ArenaplanError("arenaplan: record='eager' needs warmup >= 1 (the last warm-up run is recorded)")
    return record != "capture" and warmup >= 1


def _raise_oom(e: RuntimeError):
    """Re-raise e, a failure inside a step: an allocation the library could
    not serve reaches Python as a RuntimeError holding the library's own
    message (arenaplan_torch_alloc throws it), and one that ran out of
    memory becomes ``torch.OutOfMemoryError``; anything else (a user's
    shape error) is raised as it is."""
    msg = str(e)
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and not isinstance(e, oom) and "CUDA out of memory." in msg and "arenaplan:" in msg:
        raise oom(msg) from e
    raise e


def graph(fn: Callable[[], Any], *, plan: Optional[str] = None, warmup: int = 3, strict: bool = False,
          budget: float = 1.0, record: str = "auto", name: Optional[str] = None,
          device: Optional[int] = None, stream: Optional["torch.cuda.Stream"] = None) -> Graph:
    """Capture ``fn()`` (no arguments; close over static inputs) into a CUDA
    graph whose every intermediate tensor has a planned address.

    Steps: ``warmup`` eager runs on the capture stream (cuBLAS workspaces,
    lazy state), the last of them recorded; planning at the lower bound
    within ``budget`` seconds; one capture served from the plan. A capture
    can allocate differently from an eager run (code that tests whether it
    is being captured): then that capture is thrown away, its own
    allocations are planned, and the step is captured again: one capture
    when eager and captured runs agree, two when not. ``record="capture"``
    records under a throwaway capture instead (always two captures: for
    steps known to differ). ``plan``: a plan file, verified on load and
    refused with :class:`PlanMismatchError` if the step differs (an extra
    allocation, such as a workspace PyTorch makes lazily in a process's
    first capture, spills and counts as a divergence); one capture. With
    ``strict`` an allocation the plan cannot serve raises instead of
    spilling. ``stream``: the capture stream, as ``torch.cuda.graph``'s
    (default: a new one). Measured on an H100 with either allocator: a
    graph captured on a stream first used after many eager steps replays
    ~12% slower (all graphs of the process then do), where one captured on
    a stream used before them does not; pass such a stream, for instance
    the one the model was warmed up on. Call outside any capture; costs a
    warm-up and one or two captures' time (milliseconds to a second for
    large models).
    """
    lib = _state.need()
    _state.check_budget(budget)
    dev = torch.cuda.current_device() if device is None else device
    eager_rec = plan is None and _check_record(record, warmup)
    stream = torch.cuda.Stream(device=dev) if stream is None else stream
    warm_up_first(fn, stream, warmup - 1 if eager_rec else warmup, dev)
    sid = lib.step_new(dev, name or getattr(fn, "__name__", "step"))
    h = stream.cuda_stream
    try:
        t0 = time.perf_counter()
        if plan is not None:
            lib.step_load(sid, plan)
        elif eager_rec:
            _record_eager(lib, sid, fn, stream)
        else:
            g0 = _recording_graph()
            out0 = _capture(lib, sid, fn, stream, g0, lambda: lib.step_record(sid, h))
            del out0
            g0.reset()
            del g0
        t1 = time.perf_counter()
        if plan is None:
            lib.step_plan(sid, budget)
        t2 = time.perf_counter()
        g, out, n = _serve_capture(lib, sid, fn, stream, strict, budget if eager_rec else None)
        torch.cuda.synchronize(dev)
        t3 = time.perf_counter()
    except BaseException:
        try:
            lib.step_close(sid)
        except ArenaplanError:
            pass
        raise
    gr = Graph(lib, sid, g, out, stream, capture_ms=(t3 - t0) * 1e3, record_ms=(t1 - t0) * 1e3,
               plan_ms=(t2 - t1) * 1e3, device=dev)
    gr.captures = n + (0 if eager_rec or plan is not None else 1)
    gr.served_capture_ms = (t3 - t2) * 1e3
    return gr
