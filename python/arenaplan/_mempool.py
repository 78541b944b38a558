"""``torch.cuda.MemPool`` and ``torch.cuda.use_mem_pool`` answered by arenaplan.

With a plugged allocator PyTorch refuses ``MemPool()`` ("pluggable does not
yet support createOrIncrefPool"), and ``use_mem_pool`` could not reach a
plugged allocator's pools anyway (its begin/end hooks take C++
``std::function``, not settable from C). :func:`install` replaces both,
on ``torch.cuda`` and ``torch.cuda.memory``, with arenaplan's own:

- ``MemPool(allocator=None)``: a pool of arenaplan's memory.
- ``MemPool(allocator=CUDAPluggableAllocator(so, "alloc", "free")._allocator)``
  (torch_memory_saver's torch mode, vLLM's sleep mode): the pool's memory
  comes from that allocator, as whole segments that arenaplan
  sub-allocates, asked for in the sizes PyTorch's caching allocator asks
  for (2 MiB for requests of up to 1 MiB, 20 MiB up to 10 MiB, larger ones
  rounded up to 2 MiB); its ``free`` gets a segment back once the pool is
  released (deleted, or :meth:`MemPool.close`) and nothing in it is
  allocated. While the pool lives its segments stay with it, as in
  PyTorch (``empty_cache`` keeps them). To know the allocator's functions,
  install wraps ``CUDAPluggableAllocator.__init__``: a pluggable allocator
  made before install cannot be a pool's allocator.
- ``use_mem_pool(pool, device=None)``: the current thread's allocations on
  the device (outside arenaplan's planned steps) go to the pool until the
  block ends; blocks nest, the innermost pool wins. While any thread is in
  such a block, arenaplan's C fast path is shut (every allocation of the
  process takes the slower path through Go).

Not served, and the nearest working path:

- ``use_on_oom=True`` (fall back to the pool when the device is out of
  memory): accepted with a warning and not honoured; catch
  ``torch.OutOfMemoryError`` and retry inside ``use_mem_pool`` instead.
- ``symmetric=True`` (NCCL symmetric memory registered through PyTorch's
  caching allocator): refused; make the symmetric buffers with
  ``torch.distributed._symmetric_memory.empty`` without arenaplan, or in a
  process that does not install it.
- A pool made from an allocator that is not a ``CUDAPluggableAllocator``
  made after install (PyTorch's built-in ones, e.g. NCCL's
  ``ncclMemAlloc`` allocator) is refused: arenaplan cannot call it. Make a
  ``CUDAPluggableAllocator`` over the same functions after install.
- ``torch.cuda.graph(pool=mempool.id)`` and other C++ users of a pool id
  (CUDAGraph Trees, ``_cuda_beginAllocateToPool``) do not see these pools:
  PyTorch's C++ side asks the plugged allocator through hooks it cannot
  set. Captures still work (arenaplan gives each its own private pool);
  ``arenaplan.torch``'s graphs share memory by plan instead.
- ``MemPool.snapshot()`` lists the pool's segments (marked with the frame
  ``MemPool N``) but their ``segment_pool_id`` is arenaplan's, not
  ``pool.id``; ``torch.cuda.memory_snapshot(pool.id)`` does not filter by it.
- ``empty_cache`` of one pool (``torch.cuda.empty_cache`` with a pool
  argument in newer versions) is the whole device's: a live pool's
  segments stay.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ._state import device_index

__all__ = ["Pools", "install"]


class Pools:
    """The memory pool exports of a loaded library (``Library``)."""

    def __init__(self, lib) -> None:
        self._lib = lib

    def new(self, alloc_fn: int = 0, free_fn: int = 0) -> int:
        """A new pool (with its own allocator's C function addresses, or
        0 and 0 for arenaplan's memory); returns its id."""
        i = ctypes.c_int(-1)
        self._lib.check(self._lib._lib.arenaplan_mempool_new(alloc_fn or 0, free_fn or 0, ctypes.byref(i)))
        return i.value

    def new_graphs(self) -> int:
        """A new pool for what CUDA graphs keep beside their arenas (the
        capture streams' workspaces), laid out beside the small arenas;
        returns its id."""
        i = ctypes.c_int(-1)
        self._lib.check(self._lib._lib.arenaplan_mempool_new_graphs(ctypes.byref(i)))
        return i.value

    def begin(self, device: int, thread: int, pool: int) -> None:
        self._lib.check(self._lib._lib.arenaplan_mempool_begin(device, thread, pool))

    def end(self, device: int, thread: int, pool: int) -> None:
        self._lib.check(self._lib._lib.arenaplan_mempool_end(device, thread, pool))

    def release(self, pool: int) -> None:
        self._lib.check(self._lib._lib.arenaplan_mempool_release(pool))

    def stats(self, pool: int) -> Dict[str, Any]:
        out = ctypes.c_void_p()
        self._lib.check(self._lib._lib.arenaplan_mempool_stats(pool, ctypes.byref(out)))
        return json.loads(self._lib._take(out.value))


# The C functions of every CUDAPluggableAllocator made since install, by
# id() of its ``_allocator`` (and of the Python object): (the object, kept
# alive so that the id is not reused; alloc address; free address).
_known: Dict[int, Tuple[Any, int, int]] = {}
_known_mu = threading.Lock()


def _remember(obj: Any, alloc_fn: int, free_fn: int) -> None:
    with _known_mu:
        _known[id(obj)] = (obj, alloc_fn, free_fn)


def functions_of(allocator: Any) -> Optional[Tuple[int, int]]:
    """The (alloc, free) C addresses behind ``allocator`` (a
    ``CUDAPluggableAllocator`` or its ``_allocator``), or None."""
    with _known_mu:
        for obj in (allocator, getattr(allocator, "_allocator", None)):
            if obj is not None and id(obj) in _known and _known[id(obj)][0] is obj:
                return _known[id(obj)][1], _known[id(obj)][2]
    return None


def _wrap_pluggable(torch) -> None:
    cls = torch.cuda.memory.CUDAPluggableAllocator
    if getattr(cls.__init__, "_arenaplan", False):
        return
    orig = cls.__init__

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str, *args, **kwargs):
        orig(self, path_to_so_file, alloc_fn_name, free_fn_name, *args, **kwargs)
        so = ctypes.CDLL(path_to_so_file)  # the handle PyTorch's dlopen got too
        a = ctypes.cast(getattr(so, alloc_fn_name), ctypes.c_void_p).value or 0
        f = ctypes.cast(getattr(so, free_fn_name), ctypes.c_void_p).value or 0
        _remember(self, a, f)
        inner = getattr(self, "_allocator", None)
        if inner is not None:
            _remember(inner, a, f)

    __init__._arenaplan = True  # type: ignore[attr-defined]
    __init__.__doc__ = orig.__doc__
    cls.__init__ = __init__


def install(lib, torch) -> Pools:
    """Answer ``torch.cuda.MemPool`` and ``use_mem_pool`` (on ``torch.cuda``
    and ``torch.cuda.memory``) with ``lib``'s pools, and remember the C
    functions of every ``CUDAPluggableAllocator`` made from now on."""
    pools = Pools(lib)
    _wrap_pluggable(torch)
    if getattr(torch.cuda.MemPool, "__module__", "") == __name__:
        return pools  # installed already: pools made since keep working
    _segments = _segments_reader(lib)

    class MemPool:
        """A pool of memory that ``use_mem_pool`` routes the current
        thread's allocations to (arenaplan's ``torch.cuda.MemPool``).

        ``allocator``: None (arenaplan's memory), or a
        ``CUDAPluggableAllocator`` made after ``arenaplan.torch.install()``
        (or its ``_allocator``), whose functions then supply the pool's
        segments. The pool is released when it is deleted or closed; its
        memory goes back as soon as no tensor made in it is alive and the
        work queued on it is done."""

        def __init__(self, allocator: Any = None, use_on_oom: bool = False, symmetric: bool = False,
                     *args: Any, **kwargs: Any) -> None:
            if symmetric:
                raise RuntimeError("arenaplan: MemPool(symmetric=True) is not served: NCCL symmetric memory is "
                                   "registered through PyTorch's own caching allocator; make symmetric buffers in a "
                                   "process without arenaplan installed")
            if use_on_oom:
                warnings.warn("arenaplan: MemPool(use_on_oom=True) is not honoured: an allocation that finds the "
                              "device out of memory raises torch.OutOfMemoryError; retry it inside use_mem_pool",
                              stacklevel=2)
            fa, ff = 0, 0
            if allocator is not None:
                fns = functions_of(allocator)
                if fns is None:
                    raise RuntimeError(
                        "arenaplan: MemPool(allocator=...): arenaplan can call only the functions of a "
                        "torch.cuda.memory.CUDAPluggableAllocator made after arenaplan.torch.install(); "
                        f"{type(allocator).__name__} {allocator!r} is not one (make the CUDAPluggableAllocator "
                        "after install)")
                fa, ff = fns
            self._allocator = allocator
            # arenaplan's own pools for the graphs' workspaces (see
            # arenaplan._graph.workspaces): laid out beside small arenas.
            graphs = bool(kwargs.pop("_graph_memory", False)) and allocator is None
            self._n = pools.new_graphs() if graphs else pools.new(fa, ff)
            self._routing = 0
            self._devices: List[int] = []
            self._lock = threading.Lock()
            self._finalizer = weakref.finalize(self, _release, pools, self._n)
            self._finalizer.atexit = False  # at exit, the process gives everything back

        @property
        def id(self) -> Tuple[int, int]:
            """The pool's id, as PyTorch gives a user-made pool's: (0, n)."""
            return (0, self._n)

        @property
        def allocator(self) -> Any:
            """The allocator the pool was made with (None: arenaplan's memory)."""
            return self._allocator

        def use_count(self) -> int:
            """1 for the pool itself, plus one per ``use_mem_pool`` block in it now."""
            return 1 + self._routing

        def snapshot(self) -> List[Dict[str, Any]]:
            """The pool's segments, in ``torch.cuda.memory_snapshot()``'s
            schema (``segment_pool_id`` is arenaplan's own pool's)."""
            name = f"MemPool {self._n}"
            out = []
            for dev in list(self._devices):
                for s in _segments(dev):
                    if any(f.get("name") == name for f in s.get("frames", ())):
                        out.append(s)
            return out

        def stats(self) -> Dict[str, Any]:
            """arenaplan's account of the pool: segments, bytes and live blocks per device."""
            return pools.stats(self._n)

        def close(self) -> None:
            """Release the pool now (as deleting it does): nothing more is
            allocated in it; its memory goes back, to its allocator where
            it has one, once no tensor made in it is alive (arenaplan's own
            memory: once the work queued on it then is done; what is free
            now, after waiting for its streams)."""
            if self._finalizer.alive:
                pools.release(self._n)  # refused while a thread routes to it
                self._finalizer.detach()

        def __repr__(self) -> str:
            return f"<arenaplan MemPool id={self.id} allocator={self._allocator!r}>"

    @contextlib.contextmanager
    def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
        """Route the current thread's allocations on ``device`` (default:
        the current device) to ``pool`` until the block ends; nests."""
        if not isinstance(pool, MemPool):
            raise TypeError(f"arenaplan: use_mem_pool wants a torch.cuda.MemPool made after install, not {pool!r}")
        if not pool._finalizer.alive:  # closed
            raise RuntimeError(f"arenaplan: use_mem_pool: MemPool {pool.id} was closed")
        dev = device_index(torch, device)
        tid = threading.get_native_id()
        pools.begin(dev, tid, pool._n)
        with pool._lock:
            pool._routing += 1
            if dev not in pool._devices:
                pool._devices.append(dev)
        try:
            yield
        finally:
            with pool._lock:
                pool._routing -= 1
            pools.end(dev, tid, pool._n)

    for mod in (torch.cuda, torch.cuda.memory):
        mod.MemPool = MemPool
        mod.use_mem_pool = use_mem_pool
    return pools


def _release(pools: Pools, n: int) -> None:
    try:
        pools.release(n)
    except Exception as e:  # a finalizer must not raise; say why the memory stays
        warnings.warn(f"arenaplan: releasing MemPool (0, {n}): {e}", RuntimeWarning)


def _segments_reader(lib):
    """A function of a device index that returns its segments in PyTorch's
    snapshot schema (arenaplan._snapshot)."""
    def read(device: int) -> List[Dict[str, Any]]:
        from . import _snapshot
        return _snapshot.torch_segments(_snapshot.raw_snapshot(lib, device))
    return read
