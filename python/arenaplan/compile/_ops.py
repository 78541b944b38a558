"""What a compiled graph's wrapper asks of torch and arenaplan.torch (tests
give it a stand-in), and the helpers over tensors it uses."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

try:
    import torch
except ModuleNotFoundError as _err:  # say what to do, not only what is missing
    from .._lib import torch_missing

    raise torch_missing("arenaplan.compile", _err) from None

from ._options import CompileOptions

_OVERWRITTEN = ("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run "
                "(arenaplan.compile: a later call of the same compiled graph overwrote it); clone() outputs that "
                "must outlive the next call")




class _Ops:
    """What a compiled graph's wrapper asks of torch and arenaplan.torch
    (tests give it a stand-in)."""

    def __init__(self):
        self._streams: Dict[int, Any] = {}
        self._ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
        self._storage = getattr(torch._C, "_construct_storage_from_data_pointer", None)
        self._tensor = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)
        self._deny = getattr(torch._C, "_set_storage_access_error_msg", None)
        self._cache_add = getattr(torch._C, "_add_cached_tensor", None)
        self._cache_remove = getattr(torch._C, "_remove_cached_tensor", None)
        self._cache_enable = getattr(torch._C, "_set_cached_tensors_enabled", None)
        self._cache_enabled = False

    @staticmethod
    def installed() -> bool:
        """Whether arenaplan.torch.install() ran in this process."""
        from .. import _state
        return _state.lib is not None

    @staticmethod
    def is_tensor(x) -> bool:
        return isinstance(x, torch.Tensor)

    @staticmethod
    def device(t) -> Tuple[str, Optional[int]]:
        if t.is_cuda:  # without the torch.device object, which costs a call microseconds
            return ("cuda", t.get_device())
        return (t.device.type, t.device.index)

    @staticmethod
    def shape_key(t) -> Hashable:
        return (tuple(t.shape), tuple(t.stride()), t.dtype)

    @staticmethod
    def data_ptr(t) -> int:
        return t.data_ptr()

    @staticmethod
    def nbytes(t) -> int:
        return t.numel() * t.element_size()

    def ptrs_equal(self, args: list, ptrs: list, idxs: list) -> bool:
        """Whether args[i] is at ptrs[i] for every i in idxs (one C++ call
        where torch has it: CUDAGraph Trees' own check)."""
        if self._ptrs_equal is not None:
            return self._ptrs_equal(args, ptrs, idxs)
        return all(args[i].data_ptr() == ptrs[i] for i in idxs)

    @staticmethod
    def placeholder(t):
        """A tensor like t (shape, strides, dtype, device) to copy inputs into."""
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    @staticmethod
    def layout(t) -> Hashable:
        """What :meth:`empty` and :meth:`at` make a tensor like: t's shape,
        strides, dtype and device."""
        return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    @staticmethod
    def empty(layout):
        """A new tensor of that layout (inside a step: a planned buffer),
        its memory left as it is even where deterministic algorithms fill
        new memory (a fill inside a captured step would be a graph node,
        writing over the input each replay copies there first)."""
        shape, stride, dtype, device = layout
        with _no_fill():
            return torch.empty_strided(shape, stride, dtype=dtype, device=device)

    @staticmethod
    def zero(t) -> None:
        """Set t to zeros (allocates nothing)."""
        with torch.no_grad():
            t.zero_()

    def at(self, ptr: int, layout):
        """A tensor of that layout at ptr that owns nothing (an input's
        planned address, written before each replay)."""
        shape, stride, dtype, device = layout
        nbytes = _span(shape, stride) * dtype.itemsize
        return self._tensor({"dtype": dtype, "size": shape, "stride": stride, "storage_offset": 0},
                            self._storage(ptr, device, nbytes))

    @staticmethod
    def capturing() -> bool:
        return torch.cuda.is_current_stream_capturing()

    @staticmethod
    def host(t):
        """A host copy of the memory t spans (elements and the gaps between
        them), for :meth:`fill`; no autograd history (which would keep t).
        Waits for the device."""
        with torch.no_grad():
            return _flat(t).cpu()

    @staticmethod
    def fill(dst, src) -> None:
        """Copy src (a tensor of dst's layout, or its :meth:`host` copy) over
        dst: one contiguous copy, which allocates no device memory (a step's
        recorded run allocates what its capture does)."""
        with torch.no_grad():
            _flat(dst).copy_(_flat(src))

    @staticmethod
    def rng_state(device: Optional[int]):
        """The CUDA generator's state on device (seed and offset): what the
        runs before a capture advance and :meth:`set_rng_state` undoes."""
        return torch.cuda.get_rng_state("cuda" if device is None else device)

    @staticmethod
    def set_rng_state(state, device: Optional[int]) -> None:
        torch.cuda.set_rng_state(state, "cuda" if device is None else device)

    @staticmethod
    def grad(x):
        """x's ``.grad`` where x is a leaf that requires one (a parameter), else None."""
        if isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad:
            return x.grad
        return None

    @staticmethod
    def move_out(ts: Sequence[Any], extra: int = 0) -> bool:
        """Give the tensors ts, all over one storage, memory of their own
        outside the arena: one copy of that storage, which each then uses
        (every holder of one sees the move: a parameter's ``.grad``). False,
        nothing moved, where a tensor not in ts shares the storage (a view
        of it would still read the arena). ``extra``: references to the
        storage known to be no tensor's (what torch keeps beside a tensor
        made over a graph's output)."""
        from torch.multiprocessing.reductions import StorageWeakRef
        st = ts[0].untyped_storage()
        ref = StorageWeakRef(st)
        del st
        if torch._C._storage_Use_Count(ref.cdata) != len(ts) + extra:
            return False
        with torch.no_grad():
            whole = torch.empty(0, dtype=torch.uint8, device=ts[0].device).set_(ts[0].untyped_storage())
            mine = whole.clone()
            del whole
            new = mine.untyped_storage()
            del mine
            for t in ts:
                t.set_(new, t.storage_offset(), t.size(), t.stride())
        return True

    @staticmethod
    def extent(t) -> Tuple[int, int]:
        """The device addresses [start, end) of t's storage."""
        st = t.untyped_storage()
        p = st.data_ptr()
        return p, p + st.nbytes()

    @staticmethod
    def copy(dst, src) -> None:
        dst.copy_(src)

    @staticmethod
    def copy_all(dsts: list, srcs: list) -> None:
        """dsts[i].copy_(srcs[i]) for every i, in one call where there are
        several (as CUDAGraph Trees copy a replay's inputs): each copy_
        costs a replay tens of microseconds of host time."""
        if len(dsts) == 1:
            dsts[0].copy_(srcs[0])
        elif dsts:
            torch._foreach_copy_(dsts, srcs)

    def stream(self, device: int):
        """One capture stream per device for every graph the backend captures
        (a stream used before eager steps keeps replays fast; see
        arenaplan.torch.graph)."""
        s = self._streams.get(device)
        if s is None:
            from .._graph import capture_stream  # imported late: it needs torch
            s = self._streams[device] = capture_stream(device)
        return s

    @contextlib.contextmanager
    def on_capture_stream(self, device: int):
        """Run the block on device's capture stream (:meth:`stream`), after
        the work queued on the program's current stream, which then waits
        for it: a compiled graph's warm-up calls run there, as CUDAGraph
        Trees' do, so that their matrix products use the capture stream's
        cuBLAS and cuBLASLt workspaces, which every capture keeps anyway,
        and not workspaces of the program's stream made anew beside them
        (32 MiB each on a Hopper GPU). This thread's workspaces on the
        capture stream are made in their pool first, unless they are there
        (a backward runs in autograd's thread, whose own would otherwise be
        made beside the forward's; and each thread's making drops the
        others': made in the pool, they take its memory in turn). Where a
        capture is under way, or the capture stream is current, the block
        runs where it is."""
        if self.capturing():
            yield
            return
        s = self.stream(device)
        cur = torch.cuda.current_stream(device)
        if s == cur:
            yield
            return
        from .._graph import ensure_workspaces  # imported late: it needs torch
        ensure_workspaces(s, device)
        s.wait_stream(cur)
        try:
            with torch.cuda.stream(s):
                yield
        finally:
            cur.wait_stream(s)

    @staticmethod
    def used_here(outs: Any, device: int) -> None:
        """Mark every CUDA tensor of outs (a tensor, or a list or tuple of
        them) as used on device's current stream (``record_stream``): made
        on the capture stream by :meth:`on_capture_stream`'s block, their
        memory goes to no allocation there before the program is done with
        them."""
        cur = torch.cuda.current_stream(device)
        for t in outs if isinstance(outs, (list, tuple)) else (outs,):
            if isinstance(t, torch.Tensor) and t.is_cuda and t.device.index == device:
                t.record_stream(cur)

    @staticmethod
    def warm_pool():
        """A new memory pool for graph memory (arenaplan's
        ``torch.cuda.MemPool``, laid out in the graph heap beside the
        workspaces and small arenas), or None where arenaplan does not
        serve them (not installed)."""
        mp = getattr(torch.cuda, "MemPool", None)
        if getattr(mp, "__module__", "") != "arenaplan._mempool":
            return None
        return mp(_graph_memory=True)

    @staticmethod
    def in_pool(pool, device: Optional[int]):
        """Route this thread's allocations on device to pool (None: nowhere
        else) for the block."""
        if pool is None:
            return contextlib.nullcontext()
        return torch.cuda.use_mem_pool(pool, device=device)

    @staticmethod
    def close_pool(pool) -> None:
        pool.close()


    def capture(self, fns: Dict[Hashable, Callable[[], Any]], name: str, device: int, opts: CompileOptions):
        from .._family import graphs  # imported late: it needs torch
        return graphs(fns, warmup=opts.capture_warmup, strict=opts.strict, budget=opts.budget,
                      name=name, device=device, stream=self.stream(device))

    def add_member(self, fam, key: Hashable, fn: Callable[[], Any], device: int, opts: CompileOptions,
                   around: Sequence[Tuple[int, int]] = ()) -> None:
        """GraphFamily.add on the backend's capture stream: raises when the
        member does not fit in the family's arena (a member planned
        ``around`` memory the program holds grows the arena instead)."""
        fam.add(key, fn, warmup=opts.capture_warmup, strict=opts.strict, budget=opts.budget,
                stream=self.stream(device), around=around)

    def replan_member(self, fam, key: Hashable, fn: Callable[[], Any], around: Sequence[Tuple[int, int]],
                      device: int, opts: CompileOptions) -> None:
        """GraphFamily.replan_around on the backend's capture stream: member
        key planned again around ``around`` too, its outputs where they
        were, and captured once more from fn; raises where the library
        refuses (the member captured again as it was) or the capture
        fails (the member gone from the family)."""
        fam.replan_around(key, fn, around, strict=opts.strict, budget=opts.budget, stream=self.stream(device))

    def recapture_member(self, fam, key: Hashable, fn: Callable[[], Any], device: int, opts: CompileOptions) -> None:
        """GraphFamily.recapture on the backend's capture stream: member key
        captured once more on its plan from fn (other parameters of the same
        shapes); raises where the capture fails (the member gone)."""
        fam.recapture(key, fn, strict=opts.strict, budget=opts.budget, stream=self.stream(device))

    def capture_chain(self, stages: List[Callable[[Optional[list]], Any]], name: str, device: int,
                      opts: CompileOptions, capture: Optional[int] = None):
        """A chain of the stages, its first ``capture`` captured (default
        all); :meth:`GraphChain.capture` captures the others. Its eager
        passes (the recorded one) run on the capture stream, as the
        warm-up calls before them do (:meth:`on_capture_stream`): on the
        program's stream, the forward's matrix products would make a
        cuBLAS workspace there (32 MiB on a Hopper GPU) that stays beside
        the capture stream's for good."""
        from .._chain import chain  # imported late: it needs torch
        with self.on_capture_stream(device):
            return chain(stages, warmup=opts.capture_warmup, strict=opts.strict, budget=opts.budget,
                         name=name, device=device, stream=self.stream(device), capture=capture)

    @staticmethod
    def meta(t) -> Hashable:
        """What identifies a tensor handed from a forward to its backward."""
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

    @staticmethod
    def is_scalar(t) -> bool:
        return t.dim() == 0

    @staticmethod
    def storage_id(t) -> int:
        """t's storage, by identity (unique while it lives)."""
        return t.untyped_storage()._cdata

    def can_make_outputs(self) -> bool:
        """Whether this torch can make tensors over a graph's outputs' memory
        and tell whether anything holds one (:meth:`held_outputs`)."""
        return (self._storage is not None and self._tensor is not None and
                hasattr(torch.Tensor, "_use_count") and hasattr(torch._C, "_storage_Use_Count"))

    def output_makers(self, outs: Sequence[Any]) -> List[Optional[Callable[[], Tuple[Any, Any]]]]:
        """Per output of a captured stage: a function making a new tensor
        over its memory that owns nothing (so that one still held can be
        made to raise on access), with the token :meth:`held_outputs` reads;
        None for an output returned as it is (not a device tensor, or
        empty)."""
        from torch.multiprocessing.reductions import StorageWeakRef
        mk_storage, mk_tensor, count = self._storage, self._tensor, torch._C._storage_Use_Count
        makers: List[Optional[Callable[[], Tuple[Any, Any]]]] = []
        for o in outs:
            if isinstance(o, torch.Tensor) and o.is_cuda and o.numel() > 0:
                st = o.untyped_storage()
                args = (st.data_ptr(), o.device, st.nbytes())
                meta = {"dtype": o.dtype, "size": tuple(o.shape), "stride": tuple(o.stride()),
                        "storage_offset": o.storage_offset()}

                def make(args=args, meta=meta):
                    t = mk_tensor(meta, mk_storage(*args))
                    ref = StorageWeakRef(t.untyped_storage())
                    # What holds the storage now (the tensor, and whatever
                    # torch keeps beside it): more later means a view.
                    return t, (ref.cdata, count(ref.cdata), ref)
                makers.append(make)
            else:
                makers.append(None)
        return makers

    @staticmethod
    def held_outputs(slots: List[Any], tokens: List[Any]) -> List[int]:
        """The indices of the made tensors that something besides the list
        holds: another reference to the tensor object, to its TensorImpl
        (autograd saved it, a parameter's ``.grad`` is it) or to its storage
        (a view, AccumulateGrad's detached alias)."""
        ref, count = sys.getrefcount, torch._C._storage_Use_Count
        # slots[i] as an argument: the list's reference and the argument's;
        # the TensorImpl: the tensor object's; the storage: as when made.
        return [i for i, tok in enumerate(tokens) if tok is not None and
                (ref(slots[i]) > 2 or slots[i]._use_count() > 1 or count(tok[0]) > tok[1])]

    @staticmethod
    def extra_refs(token) -> int:
        return token[1] - 1

    def can_cache(self) -> bool:
        return self._cache_add is not None and self._cache_remove is not None and self._cache_enable is not None

    def set_cached(self, t, on: bool) -> None:
        """Register t with autograd as a cached output (a reference held
        outside the program, ignored where autograd decides whether it may
        take a gradient as it is), or no longer."""
        if on:
            if not self._cache_enabled:
                self._cache_enable(True)  # process-wide; what CUDAGraph Trees turn on
                self._cache_enabled = True
            self._cache_add(t)
        else:
            self._cache_remove(t)

    def deny(self, outs: Sequence[Any]) -> None:
        """Make reading ``outs`` raise (those tensors: views a caller made of
        them are not reached, as with CUDAGraph Trees)."""
        if self._deny is None:
            return
        for o in outs:
            if isinstance(o, torch.Tensor):
                self._deny(o, _OVERWRITTEN)


@contextlib.contextmanager
def _no_fill():
    """A block in which new memory is not filled (what
    ``torch.use_deterministic_algorithms(True)`` does to ``empty`` by
    default)."""
    det = getattr(getattr(torch, "utils", None), "deterministic", None)
    prev = getattr(det, "fill_uninitialized_memory", None)
    if prev is None or not prev:
        yield
        return
    det.fill_uninitialized_memory = False
    try:
        yield
    finally:
        det.fill_uninitialized_memory = prev


def _span(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements from a tensor's first to its last, gaps included."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _flat(t):
    """t's span as one contiguous 1-D tensor over its memory."""
    return t.as_strided((_span(t.shape, t.stride()),), (1,), t.storage_offset())
