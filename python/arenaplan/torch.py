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

    ch = ap.chain([fwd, bwd])                     # steps in turn handing tensors on (a forward and its
    ch.replay(0); ch.replay(1)                    # backward), one arena planned on one timeline

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
plugged allocator: such a request (``mode="max-autotune"`` too, and
inductor's ``triton.cudagraphs``) compiles on the ``arenaplan`` backend
instead, the same graphs on a planned arena (``arenaplan.compile``), or is
refused when asked for with ``install(reduce_overhead="refuse")``. Out of memory raises
``torch.OutOfMemoryError`` worded as PyTorch's ("CUDA out of memory. Tried
to allocate ..."), as PyTorch's allocator does (the library throws
PyTorch's own c10::OutOfMemoryError), and counts in ``num_ooms``. Still
off: ``cudnn.benchmark``'s cache query and CUDA IPC
(``share_memory_``).
"""
from __future__ import annotations

import os
from typing import Optional

try:
    import torch
except ModuleNotFoundError as _err:  # say what to do, not only what is missing
    from ._lib import torch_missing

    raise torch_missing("arenaplan.torch", _err) from None

from . import _state
from ._chain import GraphChain, chain
from ._eager import EagerStep, eager
from ._family import GraphFamily, graphs
from ._graph import Graph, graph
from ._lib import ArenaplanError, Library, PlanMismatchError
from ._sleep import pause, paused, paused_tags, region, resume

__all__ = ["install", "installed", "graph", "graphs", "chain", "eager", "Graph", "GraphFamily", "GraphChain",
           "EagerStep", "stats", "region", "pause", "resume", "paused", "paused_tags", "ArenaplanError",
           "PlanMismatchError"]


def install(library: Optional[str] = None, *, reduce_overhead: Optional[str] = None) -> None:
    """Make arenaplan PyTorch's CUDA allocator for every device.

    Call once, before anything initialises CUDA (PyTorch refuses to swap
    an initialised allocator). Also installs the ``record_stream`` and
    ``empty_cache`` hooks. Costs one dlopen. Calling it again is a no-op
    when ``library`` is None or the library installed; another library
    raises (a process has one allocator, and a second Go shared library
    in one process is fatal).

    ``reduce_overhead``: what ``torch.compile(mode="reduce-overhead")`` and
    other requests for CUDA graphs on PyTorch's allocator get: ``"arenaplan"``
    (default; the ``arenaplan`` backend compiles them, with
    reduce-overhead's contract) or ``"refuse"`` (they raise
    ``CUDAGraphTreesError`` at the call). Default: the environment's
    ``ARENAPLAN_REDUCE_OVERHEAD``, else ``"arenaplan"``.
    """
    from . import _compat
    route = reduce_overhead or os.environ.get("ARENAPLAN_REDUCE_OVERHEAD") or _compat.ROUTE
    if route not in (_compat.ROUTE, _compat.REFUSE):
        raise ValueError(f"arenaplan.torch.install: reduce_overhead={route!r}: want "
                         f"{_compat.ROUTE!r} or {_compat.REFUSE!r}")
    if _state.lib is not None:
        if library is not None and os.path.realpath(library) != _state.lib.path:
            raise ArenaplanError(f"arenaplan.torch.install({library!r}): {_state.lib.path} is installed already "
                                 "(one allocator per process; restart the process to use another library)")
        _compat.set_route(route)
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
    from . import _mempool, _snapshot, _stats
    _stats.install(lib, torch)
    _snapshot.install(lib, torch)
    _mempool.install(lib, torch)
    _compat.install(torch, route, _register_backend)
    _state.lib = lib


def _register_backend() -> None:
    """Import arenaplan.compile, which registers the ``arenaplan`` backend."""
    import importlib
    importlib.import_module("arenaplan.compile")


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
    return _state.lib is not None


def stats(device: Optional[int] = None) -> dict:
    """arenaplan's own counters for a device, beside PyTorch's statistics
    (which install() answers too): allocations served from plans and by
    the spillover allocator, divergences, arena bytes, the spillover
    allocator's mapped / in-use / cached bytes, segments mapped and
    unmapped (``Spill.Grows``, ``Unmaps``), frees of blocks other streams
    used (``CrossStreamFrees``), the event queries and waits they cost
    (``EventQueries``, ``Syncs``), and the C fast path's hits, misses,
    drains, what it holds and the calls into Go (``FastPath.GoAllocs``;
    ``GoFrees``, the frees handed to Go, most of them queued in C and
    carried by the next allocation; ``FreeCalls``, the calls that carried
    frees alone). Two reads around a loop of steps give the counts per
    step: a steady eager step should add nothing to ``Grows``, ``Unmaps``,
    ``Syncs`` and the drains, and little to the calls into Go. Reading
    them (or PyTorch's memory statistics) leaves the blocks the fast path
    keeps where they are; the frees it queued are handed to Go first."""
    dev = torch.cuda.current_device() if device is None else device
    return _state.need().stats(dev)
