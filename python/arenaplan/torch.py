"""arenaplan for PyTorch: a model's step on a planned arena, captured once,
replayed forever.

::

    import arenaplan.torch as ap
    ap.install()                                  # before anything touches CUDA
    step = ap.graph(lambda: model(x))             # warm-up (the last run recorded), plan, one capture
    print(step.report())                          # arena vs lower bound, spill held, divergences
    out = step.replay()                           # forever, same addresses
    step.save("decode.plan")                      # offline plans
    step2 = ap.graph(fn, plan="decode.plan")      # a plan for another step is refused

    eager = ap.eager(lambda: model(x))            # repeated eager steps, same addresses every time
    out = eager()

    fam = ap.graphs({b: step_for(b) for b in (8, 4, 2, 1)})   # a batch-size family in one arena
    fam.replay(4)

    with ap.region("weights", backup=True):       # torch_memory_saver-style sleep/wake
        model = build().cuda()
    ap.pause(); ap.resume()                       # memory given back, addresses kept

How it works: :func:`install` makes ``libarenaplan.so`` PyTorch's CUDA
allocator (``torch.cuda.memory.change_current_allocator``), so it sees every
tensor. Everything outside a planned step (weights, inputs, KV caches,
cuBLAS workspaces) goes to its spillover caching allocator. :func:`graph`
records the step's allocations in its last warm-up run, plans them at the
lower bound (the peak of live bytes) with a checked plan, and captures the
step with every allocation at its planned address inside one arena. A
capture's allocations can differ from an eager run's (code that tests
whether it is being captured): then that capture is planned and the step
captured once more.

A plugged allocator switches PyTorch's memory tooling off; :func:`install`
answers it from arenaplan's own counts, in PyTorch's schemas:
``torch.cuda.memory_stats``, ``memory_allocated``, ``max_memory_*``,
``memory_reserved``, ``memory_summary``, ``reset_*`` (and
``torch.accelerator``'s), ``torch.cuda.memory._snapshot``,
``_record_memory_history``, ``memory_snapshot`` (memory_viz reads them),
and ``torch.cuda.MemPool`` / ``use_mem_pool`` (see ``_mempool``).
``torch.compile(mode="reduce-overhead")`` (CUDAGraph Trees) cannot run on a
plugged allocator: it is refused when asked for, and
``torch.compile(model, backend="arenaplan")`` gives the same graphs on a
planned arena (``arenaplan.compile``). Out of memory reaches Python as a
``RuntimeError`` worded as PyTorch's ("CUDA out of memory. Tried to
allocate ..."): code that looks for that text (accelerate's
``find_executable_batch_size``) works; ``except torch.OutOfMemoryError``
catches it only inside arenaplan's own calls (PyTorch decides the
exception's type from the C++ class thrown, and its class cannot be built
outside libtorch without depending on one torch version's layout).
Still off: ``cudnn.benchmark``'s cache query and CUDA IPC
(``share_memory_``).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from ._lib import ArenaplanError, Library, PlanMismatchError

__all__ = ["install", "installed", "graph", "graphs", "eager", "Graph", "GraphFamily", "EagerStep", "stats",
           "region", "pause", "resume", "paused", "paused_tags", "ArenaplanError", "PlanMismatchError"]

_lib: Optional[Library] = None


def install(library: Optional[str] = None) -> None:
    """Make arenaplan PyTorch's CUDA allocator for every device.

    Call once, before anything initialises CUDA (PyTorch refuses to swap
    an initialised allocator). Also installs the ``record_stream`` and
    ``empty_cache`` hooks. Costs one dlopen. Calling it again is a no-op
    when ``library`` is None or the library installed; another library
    raises (a process has one allocator, and a second Go shared library
    in one process is fatal).
    """
    global _lib
    if _lib is not None:
        if library is not None and os.path.realpath(library) != _lib.path:
            raise ArenaplanError(f"arenaplan.torch.install({library!r}): {_lib.path} is installed already "
                                 "(one allocator per process; restart the process to use another library)")
        return
    if torch.cuda.is_initialized():
        raise ArenaplanError("arenaplan.torch.install() must run before CUDA is initialised "
                             "(before the first CUDA tensor, torch.cuda.* call or model.cuda())")
    lib = Library(library)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "arenaplan_torch_alloc", "arenaplan_torch_free")
    hooks = alloc._allocator
    if hasattr(hooks, "set_record_stream_fn"):
        hooks.set_record_stream_fn(lib.address("arenaplan_torch_record_stream"))
    if hasattr(hooks, "set_reset_fn"):
        hooks.set_reset_fn(lib.address("arenaplan_torch_empty_cache"))
    torch.cuda.memory.change_current_allocator(alloc)
    _count_captures(lib)
    from . import _compat, _mempool, _snapshot, _stats
    _stats.install(lib, torch)
    _snapshot.install(lib, torch)
    _mempool.install(lib, torch)
    _compat.install(torch)
    _lib = lib


_captures = 0


def _count_captures(lib: Library) -> None:
    """Wrap CUDAGraph.capture_begin/capture_end (torch.cuda.graph and
    make_graphed_callables go through them) so that the library knows when
    captures are underway, as PyTorch's own allocator does: outside them it
    skips a driver query per allocation."""
    cls = torch.cuda.CUDAGraph
    begin, end = cls.capture_begin, cls.capture_end

    def capture_begin(self, *args, **kwargs):
        global _captures
        _captures += 1
        lib.captures_underway(_captures)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            _captures -= 1
            lib.captures_underway(_captures)
            raise

    def capture_end(self, *args, **kwargs):
        global _captures
        try:
            return end(self, *args, **kwargs)
        finally:
            _captures -= 1
            lib.captures_underway(_captures)

    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    lib.captures_underway(0)


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return _lib is not None


def _need() -> Library:
    if _lib is None:
        raise ArenaplanError("arenaplan.torch.install() was not called")
    return _lib


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


def stats(device: Optional[int] = None) -> dict:
    """The allocator's counters for a device (PyTorch's memory stats are
    off while a plugged allocator is installed): allocations served from
    plans and by the spillover allocator, divergences, arena bytes, and the
    spillover allocator's mapped / in-use / cached bytes."""
    dev = torch.cuda.current_device() if device is None else device
    return _need().stats(dev)


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
        ``arena`` (planned bytes), ``lower_bound``, ``ratio``, ``spill_held``
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


def _warm_up(fn: Callable[[], Any], stream: "torch.cuda.Stream", n: int) -> None:
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        for _ in range(n):
            out = fn()
            del out
    torch.cuda.current_stream(stream.device).wait_stream(stream)
    torch.cuda.synchronize(stream.device)


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


def _capture(lib: Library, sid: int, fn: Callable[[], Any], stream: "torch.cuda.Stream",
             g: "torch.cuda.CUDAGraph", begin: Callable[[], None]) -> Any:
    """One capture of fn on stream, the step's run begun (begin: record or
    serve) and joined once the capture has begun, so that what
    CUDAGraph.capture_begin allocates on the stream (the generators'
    per-capture seed and offset, made in a process's first capture) is
    not the step's; End(failed) always, after the capture ended."""
    begun = False
    t0 = time.perf_counter()
    try:
        with torch.cuda.graph(g, stream=stream):
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
    lib = _need()
    _check_budget(budget)
    dev = torch.cuda.current_device() if device is None else device
    eager_rec = plan is None and _check_record(record, warmup)
    stream = torch.cuda.Stream(device=dev) if stream is None else stream
    _warm_up(fn, stream, warmup - 1 if eager_rec else warmup)
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


class EagerStep:
    """A step run eagerly whose tensors get the same addresses every run,
    without a graph (see :func:`eager`)."""

    def __init__(self, lib: Library, fn: Callable[..., Any], warmup: int, strict: bool, budget: float,
                 name: str, device: int):
        self._lib, self._fn = lib, fn
        self._warmup, self._strict, self._budget = warmup, strict, budget
        self._sid = lib.step_new(device, name)
        self._planned = False

    def __call__(self, *args, **kwargs) -> Any:
        if self._warmup > 0:
            self._warmup -= 1
            return self._fn(*args, **kwargs)
        h = torch.cuda.current_stream().cuda_stream
        if self._planned:
            self._lib.step_serve(self._sid, h, self._strict)
        else:
            self._lib.step_record(self._sid, h)
        with _run(self._lib, self._sid):
            out = self._fn(*args, **kwargs)
        if not self._planned:
            self._lib.step_plan(self._sid, self._budget)
            self._planned = True
        return out

    def report(self) -> dict:
        """As :meth:`Graph.report`: arena, lower bound, runs, divergences.
        Outputs kept alive across runs (say, last step's logits) make the
        next run's allocations at those addresses spill and count as
        divergences: drop them before the next call to stay on the plan."""
        return self._lib.step_report(self._sid)

    def save(self, path: str) -> None:
        self._lib.step_save(self._sid, path)

    def close(self) -> None:
        self._lib.step_close(self._sid)


def eager(fn: Callable[..., Any], *, warmup: int = 1, strict: bool = False, budget: float = 1.0,
          name: Optional[str] = None, device: Optional[int] = None) -> EagerStep:
    """Wrap ``fn`` so that repeated eager calls get the same addresses: the
    first ``warmup`` calls run plainly (eager sequences repeat exactly after
    the first step), the next is recorded and planned, and every later call
    is served from the plan on the current stream."""
    lib = _need()
    _check_budget(budget)
    dev = torch.cuda.current_device() if device is None else device
    return EagerStep(lib, fn, warmup, strict, budget, name or getattr(fn, "__name__", "step"), dev)


class GraphFamily:
    """One step captured at several sizes (a decode step at batch sizes 1,
    2, 4, ...) into ONE arena planned for all of them: it is as large as the
    largest member needs, and the smaller members cost nothing more.

    Members never run concurrently: their memory overlaps by design, so a
    member's outputs are valid until the next replay of any member (clone
    what must survive), and are tensors that do not own their memory (as
    vLLM keeps its graphs' outputs): do not use them after :meth:`close`. :meth:`replay` orders a replay after the previous
    one when the current stream changed, so concurrency cannot happen
    through it. Tensors the members share (static inputs allocated at the
    largest size and sliced, weights, a KV cache) are made outside the
    family and used by every member at the same addresses.
    """

    def __init__(self, lib: Library, fid: int, graphs: Dict[Any, "torch.cuda.CUDAGraph"], outputs: Dict[Any, Any],
                 sids: Dict[Any, int], capture_ms: Dict[Any, float], plan_ms: float, device: int):
        self._lib, self._fid = lib, fid
        self._graphs, self.outputs, self._sids = graphs, outputs, sids
        self.capture_ms, self.plan_ms = capture_ms, plan_ms
        self.record_ms: Dict[Any, float] = {}  # each member's recording run
        self.captures: Dict[Any, int] = {}  # each member's captures, the recording one included
        self.capture_parts_ms: Dict[Any, list] = {}  # per served capture: [entry, step, end]
        self._device = device
        self._last_stream = None

    @property
    def keys(self):
        """The members' keys, in capture order (largest first)."""
        return list(self._graphs)

    def replay(self, key) -> Any:
        """Replay member ``key`` on the current stream; returns its outputs.
        Raises as :meth:`Graph.replay` does (closed, paused) and
        ``KeyError`` for an unknown key."""
        if self._graphs is None:
            raise ArenaplanError(f"arenaplan: replay of a closed graph family (family {self._fid})")
        if self._lib.graphs_paused(self._device):
            raise ArenaplanError(f"arenaplan: the graphs' memory of device {self._device} is paused: "
                                 "arenaplan.torch.resume() first")
        g = self._graphs.get(key)
        if g is None:
            raise KeyError(f"arenaplan: no member {key!r} (members: {self.keys})")
        cur = torch.cuda.current_stream(self._device)
        if self._last_stream is not None and self._last_stream != cur:
            cur.wait_stream(self._last_stream)
        self._last_stream = cur
        g.replay()
        return self.outputs[key]

    def report(self) -> dict:
        """The family arena against the largest member's lower bound, and
        each member's report (plan, divergences, spill held)."""
        r = self._lib.family_report(self._fid)
        r["capture_ms"] = self.capture_ms
        r["record_ms"] = self.record_ms
        r["captures"] = self.captures
        r["capture_parts_ms"] = self.capture_parts_ms
        r["plan_build_ms"] = self.plan_ms
        r["spill_held"] = sum(m.get("spill_held", 0) for m in r["members"])
        r["graph_bytes"] = r["arena_mapped"] + r["spill_held"]
        return r

    def save(self, path: str) -> None:
        """Write the family plan (every member, one arena) to a plan file."""
        self._lib.family_save(self._fid, path)

    def close(self) -> None:
        """Destroy the graphs and give the arena back."""
        if self._graphs is not None:
            for g in self._graphs.values():
                g.reset()
            self._graphs, self.outputs = None, None
            self._lib.family_close(self._fid)


def graphs(fns: Dict[Any, Callable[[], Any]], *, plan: Optional[str] = None, warmup: int = 2, strict: bool = False,
           budget: float = 1.0, record: str = "auto", name: Optional[str] = None,
           device: Optional[int] = None, stream: Optional["torch.cuda.Stream"] = None) -> GraphFamily:
    """Capture a family of steps into one planned arena, like vLLM's and
    SGLang's batch-size graphs. ``fns`` maps a key (a batch size) to a step
    taking no arguments; members are captured in the dict's order (give
    the largest first, as engines do). Each member: ``warmup`` eager runs,
    the last one recorded (``record`` as in :func:`graph`); then one plan
    for all (``plan``: a family plan file, refused with
    :class:`PlanMismatchError` for another family); then one capture per
    member, two for a member whose capture allocated differently from its
    eager run (it is planned again from its capture, inside the family
    arena). ``stream``: the capture stream, as for :func:`graph`."""
    lib = _need()
    _check_budget(budget)
    dev = torch.cuda.current_device() if device is None else device
    if not fns:
        raise ArenaplanError("arenaplan.torch.graphs: no members")
    _check_keys(fns)
    eager_rec = plan is None and _check_record(record, warmup)
    stream = torch.cuda.Stream(device=dev) if stream is None else stream
    h = stream.cuda_stream
    fid = lib.family_new(dev, name or "family")
    sids, cap_ms, rec_ms, gs, outs, ncap = {}, {}, {}, {}, {}, {}
    try:
        for key, fn in fns.items():
            _warm_up(fn, stream, warmup - 1 if eager_rec else warmup)
            sids[key] = lib.family_member(fid, str(key))
        if plan is None:
            for key, fn in fns.items():
                t = time.perf_counter()
                if eager_rec:
                    _record_eager(lib, sids[key], fn, stream)
                else:
                    g0 = _recording_graph()
                    o = _capture(lib, sids[key], fn, stream, g0, lambda: lib.step_record(sids[key], h))
                    del o
                    g0.reset()
                rec_ms[key] = (time.perf_counter() - t) * 1e3
            t1 = time.perf_counter()
            lib.family_plan(fid, budget)
        else:
            t1 = time.perf_counter()
            lib.family_load(fid, plan)
        plan_ms = (time.perf_counter() - t1) * 1e3
        parts = {}
        for key, fn in fns.items():
            t = time.perf_counter()
            g, out, n = _serve_capture(lib, sids[key], fn, stream, strict, budget if eager_rec else None)
            # The next member's buffers overlap this one's outputs by design:
            # keep them as tensors that do not own their memory (vLLM's weak
            # references), so that no address is ever live twice.
            outs[key] = _weak(out)
            del out
            gs[key] = g
            torch.cuda.synchronize(dev)
            cap_ms[key] = (time.perf_counter() - t) * 1e3
            ncap[key] = n + (0 if eager_rec or plan is not None else 1)
            parts[key] = list(_capture_parts)
    except BaseException:
        for g in gs.values():
            g.reset()
        try:
            lib.family_close(fid)
        except ArenaplanError:
            pass
        raise
    fam = GraphFamily(lib, fid, gs, outs, sids, cap_ms, plan_ms, dev)
    fam.record_ms, fam.captures, fam.capture_parts_ms = rec_ms, ncap, parts
    return fam


class _CudaArray:
    """Exposes device memory through __cuda_array_interface__ without
    owning it."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _weak(out: Any) -> Any:
    """``out`` with every CUDA tensor replaced by one over the same memory
    that does not own it (valid while the memory stays where it is)."""
    import torch.utils._pytree as pytree

    def weak(t):
        if not isinstance(t, torch.Tensor) or not t.is_cuda or t.numel() == 0:
            return t
        span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        raw = torch.as_tensor(_CudaArray(t.data_ptr(), span * t.element_size()), device=t.device)
        return raw.view(t.dtype).as_strided(t.shape, t.stride())
    return pytree.tree_map(weak, out)




@contextlib.contextmanager
def region(tag: str, *, backup: bool = False, device: Optional[int] = None) -> Iterator[None]:
    """Allocations this thread makes inside the block (outside graph
    captures) belong to region ``tag``: :func:`pause` releases their device
    memory and :func:`resume` maps it back at the same addresses, restoring
    the contents when ``backup`` (kept in page-locked host memory from one
    pause to the next), dropping them otherwise. torch_memory_saver's
    ``region(tag=..., enable_cpu_backup=...)``."""
    lib = _need()
    dev = torch.cuda.current_device() if device is None else device
    tid = threading.get_native_id()
    lib.region_begin(dev, tid, tag, backup)
    try:
        yield
    finally:
        lib.region_end(dev, tid)


def pause(*tags: str, device: Optional[int] = None) -> None:
    """Release the device memory of the regions named (``"graphs"``: every
    captured graph's arena and pools; none: everything), keeping every
    address: tensors and graphs are valid again after :func:`resume`.
    Waits for the device. Pausing a paused tag raises; so does replaying a
    graph while ``"graphs"`` is paused on its device. A pause that fails
    half way is undone, or its error names what stays paused (as
    :func:`paused_tags` does). Freeing a paused tensor is fine.
    NCCL: graphs that registered user buffers (``NCCL_GRAPH_REGISTER=1``)
    keep stale registrations after a same-address resume; capture with
    ``NCCL_GRAPH_REGISTER=0``."""
    lib = _need()
    dev = torch.cuda.current_device() if device is None else device
    lib.pause(dev, list(tags))


def resume(*tags: str, device: Optional[int] = None) -> None:
    """Map the memory of the paused regions named (none: everything paused)
    back at the same addresses and restore the backed-up ones."""
    lib = _need()
    dev = torch.cuda.current_device() if device is None else device
    lib.resume(dev, list(tags))


def paused(tag: str = "graphs", *, device: Optional[int] = None) -> bool:
    """Whether ``tag`` (default: the graphs' memory, whose replays are then
    refused) is paused on the device, as the library holds it."""
    return tag in paused_tags(device=device)


def paused_tags(*, device: Optional[int] = None) -> frozenset:
    """The tags paused on the device (``"graphs"`` among them when the
    graphs' memory is), as the library holds them."""
    lib = _need()
    dev = torch.cuda.current_device() if device is None else device
    return lib.paused(dev)


_MAX_BUDGET_S = 3600.0  # the library's bridge.MaxBudget


def _check_budget(budget: Any) -> None:
    """A planning budget in seconds: a finite number from 0 (the library's
    default) up to an hour."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"arenaplan: budget={budget!r}: want a number of seconds")
    if math.isnan(budget) or math.isinf(budget):
        raise ValueError(f"arenaplan: budget={budget!r}: want a finite number of seconds")
    if budget < 0:
        raise ValueError(f"arenaplan: budget={budget!r} is negative (0: the library's default)")
    if budget > _MAX_BUDGET_S:
        raise ValueError(f"arenaplan: budget={budget!r} s is more than the most allowed, {_MAX_BUDGET_S:g} s")


def _check_keys(fns: Dict[Any, Any]) -> None:
    """Members are named by str(key) in the library and in plan files: two
    keys with one name (1 and "1") would collide there."""
    names: Dict[str, Any] = {}
    for key in fns:
        name = str(key)
        if name in names:
            raise ValueError(f"arenaplan.torch.graphs: keys {names[name]!r} and {key!r} have one name, "
                             f"{name!r} (members are named by str(key)): use keys that differ as strings")
        names[name] = key
