"""torch.compile on arenaplan's graphs: a dynamo backend.

::

    import arenaplan.torch as ap
    import arenaplan.compile                      # registers the backend "arenaplan"
    ap.install()                                  # before anything touches CUDA
    model = build().cuda().eval()
    fast = torch.compile(model, backend="arenaplan")
    with torch.no_grad():
        out = fast(x)                             # compiles; runs inductor's code
        out = fast(x)                             # captures once on a planned arena, then replays
    print(arenaplan.compile.report())             # per compiled graph: arena, lower bound, captures, fallbacks

What ``torch.compile(mode="reduce-overhead")`` (CUDAGraph Trees) does, on
arenaplan's allocator, where CUDAGraph Trees cannot run (they need the
caching allocator's private pools and checkpoints, which a plugged allocator
refuses). The backend compiles with inductor, inductor's own CUDA graphs
off, and wraps every compiled graph: its first ``warmup`` calls run
inductor's code as it is (autotuning, lazy workspaces); the next call
captures it with :func:`arenaplan.torch.graphs`: warm-up runs, one recorded,
a plan at the lower bound of live bytes, one capture; every later call
copies the inputs that are not parameters or buffers to their planned
addresses and replays. Those inputs are buffers of the plan: allocated at
the step's start, freed by inductor's code after their last use, so that
an image a vision model reads once shares its memory with later
activations, and no copy of an input is held outside the arena (a host
copy of the first one is kept, for the runs before a later re-capture).
An input already at its planned address (the previous call's output fed
back) is not copied; one in memory that the copies write (an earlier
output elsewhere in the arena) is cloned before them.
Parameters and buffers (inductor's ``static_input_idxs``) are read
in place; their addresses are checked on every call, and a call with other
addresses is captured as another member. Outputs live at fixed addresses in
the arena: the outputs a call returns are overwritten by the graph's next
call, and reading those tensors after that raises, as CUDAGraph Trees'
outputs do (views made of them do not raise: clone what must survive). ``torch.compiler.cudagraph_mark_step_begin()``
may be called as with CUDAGraph Trees: every call of a captured graph starts
a new step here, so it never has to be.

Each call happens once, as far as the program can tell. The call that
captures runs the graph more than once (warm-up runs, the recorded run, then
the first replay), so the runs before the replay are undone: the inputs the
graph writes in place (running statistics, an optimizer's parameters and
moments: AOTAutograd's mutated inputs) are copied to the host before them
and written back after, and the CUDA generator gets its state back, so that
the replay draws the random numbers the call would have drawn without
graphs and the generator advances as without them. A training loop's
parameters, buffers, optimizer state and RNG state after N steps are then
those of the same loop without graphs, bit for bit (see
``bench/torch_train_loops.py``). A buffer planned for a copied input is
allocated without the fill that ``torch.use_deterministic_algorithms``
makes (captured, the fill would overwrite the input each replay copies in).

Several shapes (a graph compiled with dynamic shapes and called at batch 32,
8, 1): one member per shape, all members in ONE arena planned jointly (an
:class:`arenaplan.torch.GraphFamily`), at most ``max_shapes`` of them; a
shape beyond that runs inductor's code without a graph, with one warning.
A new shape that fits in the family's arena (a smaller one after a larger)
joins it with one capture of its own (:meth:`GraphFamily.add`); one that
does not re-captures the family, every member once more, largest first.

Training: AOTAutograd's forward and backward of a graph are captured
together as ONE chain (:func:`arenaplan.torch.chain`) after one plain
forward and backward at a shape (each in a memory pool of its own, released
when it returns, so that its activations go back to the driver as they are
freed rather than stay cached beside the arena): one arena planned on one
timeline, the activations the forward saves read in place by the backward
and their memory reused once it frees them. The backward is captured at its
first call, when its incoming gradients are there: one that another captured
graph's backward made (a loss graph's gradient of the logits) is read in
place, as CUDAGraph Trees read it; others are copied into placeholders. Each
shape (the last, partial batch of an epoch) gets its own chain, up to
``max_shapes``. Gradients the backward returned that are still held at the
chain's next call (AccumulateGrad keeps one as ``.grad`` when the parameter
had none: gradient accumulation, ``zero_grad(set_to_none=False)``) are moved
out of the arena first, and from then on the backward's outputs are held
until the next call, so that AccumulateGrad copies them into a ``.grad`` of
its own: such loops replay. A forward while that shape's previous backward
is still pending runs inductor's code without a graph (one warning); a
backward whose saved activations a later forward overwrote raises. See
:class:`_TrainPair`.

Where a graph cannot be captured (tensors on the CPU, several devices, an
input other than a parameter or buffer written in place, an operation CUDA
graphs cannot hold, arenaplan not installed, a torch without
``torch._C._construct_storage_from_data_pointer``), inductor's code runs
without a graph and ONE warning names the reason.

Options: ``torch.compile(model, backend="arenaplan", mode=..., options={...})``.
``mode``: inductor's ("default", "max-autotune", "max-autotune-no-cudagraphs";
"reduce-overhead" means "default", since the graphs are ours). ``options``:
``warmup`` (plain calls before the capture, default 1), ``capture_warmup``
(runs inside the capture step, the last one recorded, default 2),
``max_shapes`` (default 8), ``budget`` (planning seconds, default 1.0),
``strict`` (an allocation the plan cannot serve raises), ``capture``
(False: never capture, for comparisons); every other key is an inductor
config patch (``"max_autotune": True``, ...).

Registered at import with ``torch._dynamo.register_backend``; installed
packages also reach it through the ``torch_dynamo_backends`` entry point
``arenaplan = "arenaplan.compile:backend"``.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

try:
    import torch
except ModuleNotFoundError as _err:  # say what to do, not only what is missing
    from ._lib import torch_missing

    raise torch_missing("arenaplan.compile", _err) from None

__all__ = ["backend", "report", "reset", "CompileOptions"]

NAME = "arenaplan"
_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_OVERWRITTEN = ("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run "
                "(arenaplan.compile: a later call of the same compiled graph overwrote it); clone() outputs that "
                "must outlive the next call")


class CompileOptions:
    """The backend's options, validated: a bad value raises ValueError."""

    _KEYS = {"warmup": int, "capture_warmup": int, "max_shapes": int, "budget": float, "strict": bool,
             "capture": bool, "from_mode": str}

    def __init__(self, mode: Optional[str] = None, options: Optional[Dict[str, Any]] = None):
        self.mode = mode or "default"
        if self.mode not in _MODES:
            raise ValueError(f"arenaplan: mode={mode!r}: want one of {_MODES}")
        self.warmup, self.capture_warmup, self.max_shapes = 1, 2, 8
        self.budget, self.strict, self.capture = 1.0, False, True
        self.from_mode: Optional[str] = None  # what the program asked torch.compile for, where it was routed here
        self.inductor: Dict[str, Any] = {}
        for k, v in (options or {}).items():
            want = self._KEYS.get(k)
            if want is None:
                self.inductor[k] = v
                continue
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ValueError(f"arenaplan: option {k}={v!r}: want {want.__name__}")
            setattr(self, k, v)
        if mode is None and self.from_mode in _MODES:
            self.mode = self.from_mode  # routed: the mode the program asked for (its inductor options)
        if self.warmup < 0:
            raise ValueError(f"arenaplan: option warmup={self.warmup}: want >= 0")
        if self.capture_warmup < 1:
            raise ValueError(f"arenaplan: option capture_warmup={self.capture_warmup}: want >= 1 "
                             "(the last capture warm-up run is the one recorded)")
        if self.max_shapes < 1:
            raise ValueError(f"arenaplan: option max_shapes={self.max_shapes}: want >= 1")
        if self.budget <= 0:
            raise ValueError(f"arenaplan: option budget={self.budget}: want > 0")
        if self.inductor.get("triton.cudagraphs"):
            raise ValueError("arenaplan: option triton.cudagraphs=True: the backend's graphs replace inductor's; "
                             "use backend='inductor' for CUDAGraph Trees")

    def inductor_patches(self, mode_options: Callable[[str], Dict[str, Any]]) -> Dict[str, Any]:
        """Inductor's config patches: the mode's, the caller's, and its own
        CUDA graphs off."""
        patches: Dict[str, Any] = {}
        if self.mode not in ("default", "reduce-overhead"):
            patches.update(mode_options(self.mode))
        patches.update(self.inductor)
        patches["triton.cudagraphs"] = False
        return patches


class _Ops:
    """What a compiled graph's wrapper asks of torch and arenaplan.torch
    (tests give it a stand-in)."""

    def __init__(self):
        self._streams: Dict[int, Any] = {}
        self._ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
        self._storage = getattr(torch._C, "_construct_storage_from_data_pointer", None)
        self._tensor = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)
        self._deny = getattr(torch._C, "_set_storage_access_error_msg", None)

    def ap(self):
        from . import torch as ap  # imported late: it needs torch and loads nothing until install()
        return ap

    def installed(self) -> bool:
        return self.ap().installed()

    @staticmethod
    def is_tensor(x) -> bool:
        return isinstance(x, torch.Tensor)

    @staticmethod
    def device(t) -> Tuple[str, Optional[int]]:
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
    def move_out(ts: Sequence[Any]) -> bool:
        """Give the tensors ts, all over one storage, memory of their own
        outside the arena: one copy of that storage, which each then uses
        (every holder of one sees the move: a parameter's ``.grad``). False,
        nothing moved, where a tensor not in ts shares the storage (a view
        of it would still read the arena)."""
        from torch.multiprocessing.reductions import StorageWeakRef
        st = ts[0].untyped_storage()
        ref = StorageWeakRef(st)
        del st
        if torch._C._storage_Use_Count(ref.cdata) != len(ts):
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

    def stream(self, device: int):
        """One capture stream per device for every graph the backend captures
        (a stream used before eager steps keeps replays fast; see
        arenaplan.torch.graph)."""
        s = self._streams.get(device)
        if s is None:
            from ._graph import capture_stream  # imported late: it needs torch
            s = self._streams[device] = capture_stream(device)
        return s

    @staticmethod
    def warm_pool():
        """A new memory pool (arenaplan's ``torch.cuda.MemPool``), or None
        where arenaplan does not serve them (not installed)."""
        mp = getattr(torch.cuda, "MemPool", None)
        if getattr(mp, "__module__", "") != "arenaplan._mempool":
            return None
        return mp()

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
        return self.ap().graphs(fns, warmup=opts.capture_warmup, strict=opts.strict, budget=opts.budget,
                                name=name, device=device, stream=self.stream(device))

    def add_member(self, fam, key: Hashable, fn: Callable[[], Any], device: int, opts: CompileOptions) -> None:
        """GraphFamily.add on the backend's capture stream: raises when the
        member does not fit in the family's arena."""
        fam.add(key, fn, warmup=opts.capture_warmup, strict=opts.strict, budget=opts.budget,
                stream=self.stream(device))

    def capture_chain(self, stages: List[Callable[[Optional[list]], Any]], name: str, device: int,
                      opts: CompileOptions, capture: Optional[int] = None):
        """A chain of the stages, its first ``capture`` captured (default
        all); :meth:`GraphChain.capture` captures the others."""
        return self.ap().chain(stages, warmup=opts.capture_warmup, strict=opts.strict, budget=opts.budget,
                               name=name, device=device, stream=self.stream(device), capture=capture)

    @staticmethod
    def meta(t) -> Hashable:
        """What identifies a tensor handed from a forward to its backward."""
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

    @staticmethod
    def is_scalar(t) -> bool:
        return t.dim() == 0

    @staticmethod
    def storage_ref(t):
        """A weak reference to t's storage: expired() once nothing holds it."""
        from torch.multiprocessing.reductions import StorageWeakRef
        return StorageWeakRef(t.untyped_storage())

    @staticmethod
    def storage_id(t) -> int:
        """t's storage, by identity (unique while it lives)."""
        return t.untyped_storage()._cdata

    def views(self, outs: Sequence[Any]) -> Optional[Callable[[], List[Any]]]:
        """A function making, on each call, fresh tensors over the memory of
        ``outs`` (that own nothing, so that the previous call's can be made to
        raise on access); None where torch lacks the means."""
        if self._storage is None or self._tensor is None:
            return None
        recipe = []
        for o in outs:
            if isinstance(o, torch.Tensor) and o.is_cuda and o.numel() > 0:
                st = o.untyped_storage()
                recipe.append((True, st.data_ptr(), st.nbytes(), o.device,
                               {"dtype": o.dtype, "size": tuple(o.shape), "stride": tuple(o.stride()),
                                "storage_offset": o.storage_offset()}))
            else:
                recipe.append((False, o))
        mk_storage, mk_tensor = self._storage, self._tensor

        def make() -> List[Any]:
            return [mk_tensor(r[4], mk_storage(r[1], r[3], r[2])) if r[0] else r[1] for r in recipe]
        return make

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


class _Member:
    """One shape of a compiled graph: the inputs its capture reads.

    ``args`` holds the parameters, buffers and values read as they are, and
    None for each input copied (``copy_idxs``): that input's tensor is
    allocated inside the member's step, a buffer of the plan, and each
    replay copies the call's input to its planned address (``dst``).
    ``host`` keeps a host copy of the input the member was first captured
    with: the values its tensor takes in the runs before a later capture of
    the family (indices a graph gathers with must stay in range)."""

    __slots__ = ("index", "args", "ptrs", "copy_idxs", "nbytes", "calls", "layouts", "host", "addrs", "dst")

    def __init__(self, index: int, args: list, ptrs: list, copy_idxs: list, nbytes: int):
        self.index = index  # its key in the family (short, for the library)
        self.args, self.ptrs, self.copy_idxs, self.nbytes = args, ptrs, copy_idxs, nbytes
        self.calls = 0
        self.layouts: Dict[int, Any] = {}
        self.host: Dict[int, Any] = {}
        self.addrs: Dict[int, int] = {}  # from the member's last capture: the addresses replays use
        self.dst: List[Tuple[int, Any, int, int]] = []  # (input, tensor at its address, start, end)


_runners: "weakref.WeakSet[_Runner]" = weakref.WeakSet()
# Addresses of the outputs of the training graphs captured so far, by the
# pair that owns them: a later graph whose input is one of them (the
# logits a loss graph takes from the model's graph) reads it in place, as
# CUDAGraph Trees read a parent graph's outputs, instead of copying it.
_fixed_outputs: Dict[int, int] = {}
_order = [0]
_lock = threading.Lock()


@contextlib.contextmanager
def _warm_pool(ops: "_Ops", device: Optional[int]):
    """A block in which a training graph's plain call before its capture
    allocates in a memory pool of its own, released when the call returns:
    each of its segments goes back to the driver once nothing made in it
    lives, instead of staying cached beside the arena, where the tensors
    made later (the optimizer's state, at the first step) would be placed
    among the step's freed activations and keep them mapped; as CUDAGraph
    Trees' warm-up runs in its graph's pool. (An inference graph's warm-up
    does not: a pool's fresh segments cost its first call about a second
    on a GPU, for no memory shown saved.) Without arenaplan's pools (not
    installed) the call allocates as any other."""
    pool = None
    try:
        pool = ops.warm_pool()
    except Exception as e:  # noqa: BLE001 - the call then allocates as any other
        warnings.warn(f"arenaplan.compile: no memory pool for a call before a capture ({e})", RuntimeWarning,
                      stacklevel=3)
    try:
        with ops.in_pool(pool, device):
            yield
    finally:
        if pool is not None:
            try:
                ops.close_pool(pool)
            except Exception as e:  # noqa: BLE001 - dropping it releases it too
                warnings.warn(f"arenaplan.compile: releasing the pool of a call before a capture: {e}",
                              RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def _unseen(ops: "_Ops", device: Optional[int], written: Sequence[Any]):
    """A block whose runs of a compiled graph the program must not see: the
    warm-up and recorded runs a capture makes before it (the replay that
    follows is the call's one run). The inputs the graph writes in place
    (``written``: running statistics, an optimizer's parameters and
    moments) get back the values they had before the block, from host
    copies, and the CUDA generator its state (the RNG advances as without
    graphs), whether the block succeeds or raises."""
    saved = [(t, ops.host(t)) for t in written]
    rng = ops.rng_state(device)
    try:
        yield
    finally:
        for t, h in saved:
            ops.fill(t, h)
        ops.set_rng_state(rng, device)


class _Warns:
    """One warning per kind for a compiled graph, and giving it up."""

    name: str
    reason: Optional[str]
    warned: set

    def _give_up(self, reason: str) -> None:
        self.reason = reason
        self._warn(reason, reason)

    def _warn(self, kind: str, reason: str) -> None:
        if kind in self.warned:
            return
        self.warned.add(kind)
        warnings.warn(f"arenaplan.compile: {self.name}: {reason}: inductor's code runs without a CUDA graph",
                      RuntimeWarning, stacklevel=4)


class _Runner(_Warns):
    """A compiled graph (inductor's boxed callable) run on arenaplan's graphs.

    Called with a list of inputs, which it empties (AOTAutograd's boxed
    convention, so that inputs can be freed early).
    """

    _boxed_call = True

    def __init__(self, inner: Callable[[list], Any], name: str, static_idxs: Sequence[int],
                 reason: Optional[str], opts: CompileOptions, ops: _Ops, device: Optional[int] = None,
                 mutated: Sequence[int] = ()):
        self.inner, self.name, self.opts, self.ops = inner, name, opts, ops
        self.static = sorted(set(static_idxs))
        self.mutated = sorted(set(mutated))  # inputs the graph writes in place (parameters and buffers only)
        self.reason = reason  # why this graph never captures; None while it may
        self.members: Dict[Hashable, _Member] = {}
        self.by_shape: Dict[Hashable, Hashable] = {}  # shape key -> the member key used last
        self.seen: Dict[Hashable, int] = {}  # plain calls made per shape key
        self.family = None
        self.device: Optional[int] = device
        self.dyn: Optional[List[int]] = None  # indices of the inputs that are not parameters or buffers
        self.next_index = 0
        self.captures = 0  # members captured, re-captures included
        self.family_builds = 0
        self.plain_calls = 0  # calls that ran inductor's code without a graph
        self.replays = 0
        self.warned: set = set()
        self._views: Dict[Hashable, Callable[[], List[Any]]] = {}
        self._last: Optional[List[Any]] = None
        self.input_bytes = 0  # the copied inputs' bytes, every member's, planned in the arena
        self.pair: Optional[_TrainPair] = None  # a training graph's forward and backward
        with _lock:
            _order[0] += 1
            self.order = _order[0]
        _runners.add(self)
        if reason is not None:
            self._warn(reason, reason)

    # The call.
    def __call__(self, *args) -> Any:
        # Boxed (one list, emptied so that inputs can be freed early), or
        # unpacked where a wrapper drops _boxed_call (dynamo's disable()
        # around AOTAutograd's backward).
        if len(args) == 1 and type(args[0]) is list:
            inputs = list(args[0])
            args[0].clear()
        else:
            inputs = list(args)
        if self.pair is not None:
            return self.pair.call(self, inputs)
        if self.reason is not None:
            return self._plain(inputs)
        shape = self._shape_key(inputs)
        if shape is None:
            return self._plain(inputs)
        key = self.by_shape.get(shape)
        m = self.members.get(key) if key is not None else None
        if m is not None and self.static and not self.ops.ptrs_equal(inputs, m.ptrs, self.static):
            m = None  # parameters or buffers elsewhere: another member
        if m is None:
            key = (shape, tuple(self.ops.data_ptr(inputs[i]) for i in self.static))
            m = self.members.get(key)
            if m is None:
                n = self.seen.get(shape, 0)
                if n < self.opts.warmup:
                    self.seen[shape] = n + 1
                    return self._plain(inputs)
                m = self._add(key, inputs)
                if m is None:
                    return self._plain(inputs)
            self.by_shape[shape] = key
        return self._replay(m, inputs)

    def _replay(self, m: _Member, inputs: list) -> Any:
        ops, fam = self.ops, self.family
        fam.prepare()  # the previous replay may still use the memory written here; a paused arena has none
        if m.dst:
            self._copy_in(m, inputs)
        del inputs
        if self._last is not None:
            ops.deny(self._last)
            self._last = None
        fam.replay(m.index, prepared=True)
        m.calls += 1
        self.replays += 1
        fresh = self._views[m.index]()  # _add gave up where torch cannot make them
        self._last = fresh
        return fresh

    def _copy_in(self, m: _Member, inputs: list) -> None:
        """Copy the call's inputs to their planned addresses. An input
        already there (the previous call's output at that address, fed
        back) is not copied; one whose memory a copy writes (an earlier
        output elsewhere in the arena) is first cloned outside it, since
        the copies would overwrite it before it is read."""
        ops = self.ops
        todo = [(d, inputs[i], lo, hi) for i, d, lo, hi in m.dst if ops.data_ptr(inputs[i]) != lo]
        for k, (d, src, lo, hi) in enumerate(todo):
            a, b = ops.extent(src)
            if any(a < h and l < b for _, _, l, h in todo):
                tmp = ops.empty(ops.layout(src))
                ops.copy(tmp, src)
                todo[k] = (d, tmp, lo, hi)
        for d, src, _, _ in todo:
            ops.copy(d, src)

    def _plain(self, inputs: list) -> Any:
        self.plain_calls += 1
        return self.inner(inputs)

    # Shapes and members.
    def _shape_key(self, inputs: list) -> Optional[Hashable]:
        """The key of a call's shape: the shape, strides, dtype and offset of
        every input that is not a parameter or buffer, every other input's
        value (parameters and buffers are checked by address instead); None
        (and the graph given up) where the inputs cannot be captured."""
        dyn = self.dyn
        ops, key = self.ops, []
        if dyn is None:
            static = set(self.static)
            self.static = [i for i in range(len(inputs)) if i in static and ops.is_tensor(inputs[i])]
            dyn = self.dyn = [i for i in range(len(inputs)) if i not in self.static]
        for i in dyn:
            x = inputs[i]
            if ops.is_tensor(x):
                d = ops.device(x)
                if d[0] != "cuda":
                    self._give_up(f"an input is on the {d[0]} device")
                    return None
                if self.device is None:
                    self.device = d[1]
                elif d[1] != self.device:
                    self._give_up(f"inputs on several devices (cuda:{self.device}, cuda:{d[1]})")
                    return None
                key.append(ops.shape_key(x))
            else:
                key.append(x if isinstance(x, (int, float, bool, str, type(None))) else repr(x))
        return tuple(key)

    def _add(self, key: Hashable, inputs: list) -> Optional[_Member]:
        if len(self.members) >= self.opts.max_shapes:
            self._warn("limit", f"more than max_shapes={self.opts.max_shapes} shapes (or parameter addresses); "
                                "this one and later new ones run without a graph")
            return None
        ops, static = self.ops, set(self.static)
        if ops.views([]) is None:
            self._give_up("this torch cannot make tensors at a graph's addresses "
                          "(torch._C._construct_storage_from_data_pointer)")
            return None
        args, ptrs, copy_idxs, nbytes = [], [None] * len(inputs), [], 0
        m = _Member(self.next_index, args, ptrs, copy_idxs, 0)
        for i, x in enumerate(inputs):
            if i in static and ops.is_tensor(x):
                args.append(x)
                ptrs[i] = ops.data_ptr(x)
            elif ops.is_tensor(x):
                args.append(None)  # allocated inside the step: see _step
                copy_idxs.append(i)
                m.layouts[i] = ops.layout(x)
                m.host[i] = ops.host(x)
                nbytes += ops.nbytes(x)
            else:
                args.append(x)
        m.nbytes = nbytes
        self.next_index += 1
        self.members[key] = m
        with _unseen(ops, self.device, self.written(inputs)):
            if not self._grow(m, {i: inputs[i] for i in copy_idxs}):
                return None
        self.input_bytes += nbytes
        return m

    def written(self, inputs: list) -> List[Any]:
        """The call's inputs that the graph writes in place."""
        return [inputs[i] for i in self.mutated if i < len(inputs) and self.ops.is_tensor(inputs[i])]

    def _grow(self, new: _Member, new_inputs: Dict[int, Any]) -> bool:
        """Capture member new into the family's arena as it is (the others
        keep their graphs, and the last call's outputs stay valid): when it
        fits, which a smaller shape after a larger one does; else, or with
        no family yet, capture every member again (:meth:`_build`)."""
        fam, ops = self.family, self.ops
        if fam is None:
            return self._build(new, new_inputs)
        new.addrs.clear()
        try:
            ops.add_member(fam, new.index, self._step(new, new_inputs), self.device, self.opts)
        except Exception:  # noqa: BLE001 - it does not fit, or its capture failed: capture every member again
            return self._build(new, new_inputs)
        if any(i not in new.addrs for i in new.copy_idxs):
            return self._build(new, new_inputs)
        self.captures += 1
        self._views[new.index] = ops.views(fam.outputs[new.index])
        new.dst = self._dst(new)
        return True

    def _dst(self, m: _Member) -> List[Tuple[int, Any, int, int]]:
        """Where each copied input of member m goes: (input, a tensor at its
        planned address, start, end)."""
        dst = []
        for i in m.copy_idxs:
            nbytes = self.ops.nbytes(m.host[i])  # the bytes its tensor spans
            if nbytes:
                p = m.addrs[i]
                dst.append((i, self.ops.at(p, m.layouts[i]), p, p + nbytes))
        return dst

    def _build(self, new: Optional[_Member] = None, new_inputs: Optional[Dict[int, Any]] = None) -> bool:
        """(Re)capture every member into one family arena, the largest
        (most input bytes) first; on failure give the graph up. The runs
        before each capture take the copied inputs' values from new_inputs
        for the member new, from the host copies for the others."""
        ops = self.ops
        if self.family is not None:
            self.family.close()
            self.family = None
            self._views.clear()
        if self._last is not None:
            ops.deny(self._last)
            self._last = None
        order = sorted(self.members.values(), key=lambda m: -m.nbytes)
        fns = {}
        for m in order:
            m.addrs.clear()
            fns[m.index] = self._step(m, new_inputs if m is new and new_inputs else m.host)
        try:
            fam = ops.capture(fns, f"{self.name}", self.device, self.opts)
        except Exception as e:  # noqa: BLE001 - any failure means: run without a graph
            self.members.clear()
            self._give_up(f"capture failed: {type(e).__name__}: {e}")
            return False
        if any(i not in m.addrs for m in order for i in m.copy_idxs):
            fam.close()
            self.members.clear()
            self._give_up("capture failed: a copied input was not allocated in its member's capture")
            return False
        self.family = fam
        self.family_builds += 1
        self.captures += len(fns)
        for m in order:
            self._views[m.index] = ops.views(fam.outputs[m.index])
            m.dst = self._dst(m)
        return True

    def _step(self, m: _Member, src: Dict[int, Any]) -> Callable[[], Any]:
        """Member m's step, as captured: each copied input is allocated at
        the step's start (so that the plan places it in the arena, live
        until inductor's code frees it after its last use: nothing else may
        hold it), filled from src in the runs before the capture (not in
        the capture: that would be a graph node reading src), and its
        address kept from the capture (the last capture's is the one
        replays use)."""
        ops, inner, args, layouts = self.ops, self.inner, m.args, m.layouts

        def step():
            a = list(args)
            capturing = ops.capturing()
            for i in m.copy_idxs:
                p = ops.empty(layouts[i])
                if capturing:
                    m.addrs[i] = ops.data_ptr(p)
                else:
                    ops.fill(p, src[i])
                a[i] = p
                p = None
            return inner(a)
        return step

    # Reports.
    def report(self) -> Dict[str, Any]:
        if self.pair is not None:
            return self.pair.report(self)
        r: Dict[str, Any] = {"graph": self.name, "captured": self.family is not None, "reason": self.reason,
                             "members": len(self.members), "captures": self.captures,
                             "family_builds": self.family_builds, "replays": self.replays,
                             "plain_calls": self.plain_calls, "input_bytes_planned": self.input_bytes,
                             "input_bytes_outside": 0,
                             "static_inputs": len(self.static), "other_inputs": len(self.dyn or ()),
                             "from_mode": self.opts.from_mode}
        if self.family is not None:
            f = self.family.report()
            for k in ("arena", "lower_bound", "ratio", "arena_mapped", "spill_held", "graph_bytes", "plan_build_ms"):
                if k in f:
                    r[k] = f[k]
            r["capture_ms"] = sum(f.get("capture_ms", {}).values())
        return r

    def close(self) -> None:
        if self.pair is not None:
            self.pair.close()
        if self._last is not None:
            self.ops.deny(self._last)
            self._last = None
        if self.family is not None:
            self.family.close()
            self.family = None
        self.members.clear()
        self._views.clear()

class _TrainMember:
    """One shape of a training graph: its forward and backward captured as
    one chain, and what its replays left live."""

    def __init__(self, shape: Hashable):
        self.shape = shape
        self.chain = None
        self.fw_args: list = []
        self.fw_ptrs: list = []
        self.fw_check: List[int] = []  # forward inputs read in place: parameters, other graphs' outputs
        self.fw_inplace: set = set()
        self.bw_ptrs: list = []
        self.bw_static: List[int] = []
        self.tangents: Dict[int, Any] = {}  # incoming gradients' placeholders, by backward input
        self.tangent_inplace: Dict[int, int] = {}  # ... and those read in place: the address the capture read
        self.tangent_layouts: Dict[int, Hashable] = {}
        self.tangent_keys: Dict[int, Hashable] = {}
        self.tan: Dict[int, Any] = {}  # what the backward stage gets as its incoming gradients
        self.bw_stage: Optional[Callable[[list], Any]] = None
        self.saved_cuda: List[int] = []
        self.make_fw = self.make_bw = None
        self.gen = self.bw_gen = 0
        self.saved_refs: list = []
        self.saved_ids: set = set()
        self.grad_refs: list = []
        self.grad_tensors: list = []  # weak references to the tensors the last backward replay returned
        self.grad_ptrs: set = set()  # the addresses of the backward's outputs' memory
        self.pin = False  # hold the backward's outputs until the next call (gradients are kept across calls)
        self.pinned: Optional[list] = None
        self.user_refs: list = []
        self.placeholder_bytes = 0


class _TrainPair(_Warns):
    """A training graph: AOTAutograd's forward and its backward, captured
    as ONE chain (:func:`arenaplan.torch.chain`): one arena planned on one
    timeline, the activations the forward saves read in place by the
    backward and their memory reused once it frees them.

    A shape is captured after one plain forward and backward at that shape
    (which show which backward inputs are the forward's outputs and which
    are incoming gradients, and the gradients' shapes); up to
    ``max_shapes`` shapes (the last, partial batch of an epoch is one), each
    its own chain and arena (one family arena would be re-captured at each
    new shape, moving the outputs that other captured graphs read in place:
    a loss graph reads the model graph's logits). A call that cannot replay
    safely runs inductor's code without a graph, with one warning naming
    the reason: a forward while the same shape's previous forward's saved
    activations still wait for their backward (its replay would overwrite
    them), a call while a gradient of the previous backward is still held
    where it cannot be moved out of the arena (see :meth:`_release_grads`),
    other parameter addresses, more shapes than ``max_shapes``. A backward whose saved activations a later
    forward replay overwrote (``retain_graph=True``, then another forward)
    raises.
    """

    def __init__(self, name: str, opts: CompileOptions, ops: _Ops):
        self.name, self.opts, self.ops = name, opts, ops
        self.fw: Optional[_Runner] = None
        self.bw: Optional[_Runner] = None
        self.reason: Optional[str] = None
        self.fw_out_meta: Optional[List[Any]] = None  # the last plain forward's outputs
        self.fw_in_meta: Optional[List[Any]] = None  # ... and inputs
        self.plain_shape: Optional[Hashable] = None  # ... and its shape
        self.bw_map: Optional[List[Tuple[str, Any]]] = None  # per backward input: where it comes from
        self.saved_idxs: List[int] = []
        self.saved_set: set = set()
        self.learned: Dict[Hashable, Dict[int, Any]] = {}  # per shape: incoming gradients' (layout, shape key)
        self.learned_vals: Dict[Hashable, Dict[int, Any]] = {}  # ... and its backward's other inputs (sizes)
        self.members: Dict[Hashable, _TrainMember] = {}
        self.warned: set = set()
        self.replays = {"forward": 0, "backward": 0}
        self.plain = {"forward": 0, "backward": 0}
        self.grads_moved = 0  # times held gradients were moved out of the arena before a replay

    # Calls.
    def call(self, r: _Runner, inputs: list) -> Any:
        if r is self.fw:
            return self.forward(inputs)
        return self.backward(inputs)

    def forward(self, inputs: list) -> Any:
        fw, bw, ops = self.fw, self.bw, self.ops
        if self.reason is None and bw is not None and bw.reason is not None:
            self._give_up(f"its backward cannot be captured ({bw.reason})")
        if self.reason is not None:
            return self._plain_fw(inputs, None)
        shape = fw._shape_key(inputs)
        if shape is None:
            self.reason = fw.reason  # fw warned
            return self._plain_fw(inputs, None)
        m = self.members.get(shape)
        if m is None:
            if shape not in self.learned:
                return self._plain_fw(inputs, shape)  # its backward shows what to capture
            if len(self.members) >= self.opts.max_shapes:
                self._warn("limit", f"more than max_shapes={self.opts.max_shapes} shapes; calls with later new "
                                    "ones run without a graph")
                return self._plain_fw(inputs, shape)
            with _unseen(ops, fw.device, fw.written(inputs)):
                m = self._build(inputs, shape)
            if m is None:
                return self._plain_fw(inputs, shape)
        elif m.fw_check and not ops.ptrs_equal(inputs, m.fw_ptrs, m.fw_check):
            self._warn("params", "a training graph is captured for one set of parameter addresses; calls with "
                                 "others run without a graph")
            return self._plain_fw(inputs, None)
        if m.gen > m.bw_gen and self._alive(m.saved_refs):
            self._warn("pending", "a forward ran while the previous forward's saved activations still wait for "
                                  "their backward; such forwards (and their backwards) run without a graph")
            return self._plain_fw(inputs, None)
        m.pinned = None
        if not self._release_grads(m):
            return self._plain_fw(inputs, None)
        for i in fw.dyn or ():
            dst, src = m.fw_args[i], inputs[i]
            if i not in m.fw_inplace and ops.is_tensor(src) and ops.data_ptr(dst) != ops.data_ptr(src):
                ops.copy(dst, src)
        del inputs
        prev = [t for t in (w() for w in m.user_refs) if t is not None]
        if prev:
            ops.deny(prev)
        m.chain.replay(0)
        fresh = m.make_fw()
        m.gen += 1
        self.replays["forward"] += 1
        saved = [fresh[j] for j in self.saved_idxs if ops.device(fresh[j])[0] == "cuda"]
        m.saved_refs = [ops.storage_ref(t) for t in saved]
        m.saved_ids = {ops.storage_id(t) for t in saved}
        m.user_refs = [weakref.ref(t) for j, t in enumerate(fresh) if ops.is_tensor(t) and j not in self.saved_set]
        return fresh

    def backward(self, inputs: list) -> Any:
        ops = self.ops
        if self.reason is not None:
            return self._plain_bw(inputs)
        m = next((m for m in self.members.values() if self._takes(m, inputs)), None)
        if m is None:
            # A plain forward's backward: learn from it.
            if self.plain_shape is not None and self.plain_shape not in self.learned:
                self._learn(inputs, self.plain_shape)
                return self._plain_bw(inputs, warm=True)
            return self._plain_bw(inputs)
        for i in m.saved_cuda:
            if ops.storage_id(inputs[i]) not in m.saved_ids:
                raise RuntimeError(f"arenaplan.compile: {self.name}: this backward's saved activations were "
                                   "overwritten by a later replay of its forward (retain_graph=True, then another "
                                   "forward): run the backward before the next forward")
        m.bw_gen = m.gen
        m.pinned = None
        if not self._release_grads(m):
            return self._plain_bw(inputs)
        if m.make_bw is None and not self._capture_bw(m, inputs):
            return self._plain_bw(inputs)
        for i, p in m.tangent_inplace.items():
            if ops.data_ptr(inputs[i]) != p or ops.layout(inputs[i]) != m.tangent_layouts[i]:
                self._warn("elsewhere", "an incoming gradient is not where the backward's capture read it (the "
                                        "graph that made it ran without a graph, or another did); such backwards "
                                        "run without a graph")
                return self._plain_bw(inputs)
        for i, dst in m.tangents.items():
            if ops.data_ptr(dst) != ops.data_ptr(inputs[i]):
                ops.copy(dst, inputs[i])
        del inputs
        m.chain.replay(1)
        fresh = m.make_bw()
        self.replays["backward"] += 1
        m.grad_refs = [ops.storage_ref(t) for t in fresh if ops.is_tensor(t)]
        m.grad_tensors = [weakref.ref(t) for t in fresh if ops.is_tensor(t)]
        if m.pin:
            # Held until the next call of the chain: AccumulateGrad then
            # sees another reference and copies each gradient into a
            # ``.grad`` of its own instead of keeping the arena's memory.
            m.pinned = fresh
        return fresh

    def _takes(self, m: _TrainMember, inputs: list) -> bool:
        """Whether inputs are for member m's backward: its saved activations
        at their addresses, incoming gradients of its shapes."""
        ops = self.ops
        return ops.ptrs_equal(inputs, m.bw_ptrs, m.bw_static) and all(
            ops.is_tensor(inputs[i]) and ops.shape_key(inputs[i]) == k for i, k in m.tangent_keys.items())

    def _plain_fw(self, inputs: list, shape: Optional[Hashable]) -> Any:
        """Inductor's forward without a graph; at a shape not learned yet,
        noting its inputs and outputs, in the warm-up pool."""
        ops = self.ops
        self.plain["forward"] += 1
        self.plain_shape = shape
        if shape is None or shape in self.learned:
            return self.fw.inner(inputs)
        self.fw_in_meta = [ops.meta(x) if ops.is_tensor(x) else None for x in inputs]
        with _warm_pool(ops, self.fw.device):
            outs = self.fw.inner(inputs)
        self.fw_out_meta = [ops.meta(o) if ops.is_tensor(o) else None for o in outs]
        return outs

    def _plain_bw(self, inputs: list, warm: bool = False) -> Any:
        """Inductor's backward without a graph (learning a shape: in the warm-up pool)."""
        self.plain["backward"] += 1
        if not warm:
            return self.bw.inner(inputs)
        with _warm_pool(self.ops, self.bw.device):
            return self.bw.inner(inputs)

    @staticmethod
    def _alive(refs: list) -> bool:
        return any(not w.expired() for w in refs)

    def _release_grads(self, m: _TrainMember) -> bool:
        """Whether m's chain may replay with respect to the gradients its
        last backward returned: those still held (AccumulateGrad keeps a
        gradient as ``.grad`` when the parameter had none: gradient
        accumulation, ``zero_grad(set_to_none=False)``) are moved out of the
        arena first, into memory of their own, so that the replay, which
        writes there, leaves them as they are; later backwards' gradients
        are then added into them in place, as without graphs. From then on
        the backward's outputs are held until the chain's next call, so
        that AccumulateGrad copies them into a ``.grad`` of its own rather
        than keep the arena's memory (one copy per accumulation, as the
        move was). False (with one warning; that call runs without a graph)
        where one cannot be moved: a tensor not found shares its memory (a
        view of a ``.grad``)."""
        if not self._alive(m.grad_refs):
            return True
        # This loop keeps gradients across calls: from now on, the
        # backward's outputs are held until the next call (see backward),
        # so that none becomes a .grad in the arena.
        m.pin = True
        ops = self.ops
        # AccumulateGrad keeps a detached alias of the gradient (another
        # tensor over its memory): found through the parameters.
        held: Dict[int, Dict[int, Any]] = {}  # by storage address: the tensors over it, by identity
        for t in [w() for w in m.grad_tensors] + [ops.grad(x) for x in m.fw_args]:
            if t is not None and ops.is_tensor(t):
                p = ops.extent(t)[0]
                if p in m.grad_ptrs:
                    held.setdefault(p, {})[id(t)] = t
        for group in held.values():
            if not ops.move_out(list(group.values())):
                break
        held.clear()
        if self._alive(m.grad_refs):
            self._warn("grads", "the previous backward's gradients are still held where they cannot be moved "
                                "out of the arena (a view of one is held): calls run without a graph until they "
                                "are released")
            return False
        m.grad_refs, m.grad_tensors = [], []
        self.grads_moved += 1
        return True

    # Capture.
    def _learn(self, inputs: list, shape: Hashable) -> None:
        """Which backward inputs are the forward's outputs (saved
        activations), its inputs, or incoming gradients (placeholders made
        for those, at this shape)."""
        ops, bw = self.ops, self.bw
        outs = {m: j for j, m in reversed(list(enumerate(self.fw_out_meta or []))) if m is not None}
        ins = {m: k for k, m in reversed(list(enumerate(self.fw_in_meta or []))) if m is not None}
        static = set(bw.static)
        m: List[Tuple[str, Any]] = []
        tangents: Dict[int, Any] = {}
        for i, x in enumerate(inputs):
            if not ops.is_tensor(x):
                m.append(("val", x))
                continue
            key = ops.meta(x)
            if key in outs:
                m.append(("fw", outs[key]))
            elif key in ins:
                m.append(("fwin", ins[key]))
            elif i in static:
                return  # a saved input the last plain forward did not make: not its backward
            else:
                m.append(("tan", None))
                tangents[i] = x
            d = ops.device(x)[0]
            if d != "cuda" and not (m[-1][0] == "fw" and ops.is_scalar(x)):
                # A forward's 0-dim output on the host (the random seed and
                # offset of SDPA's efficient attention outside a capture;
                # inside it they are device tensors) goes with the chain;
                # any other host tensor cannot.
                self._give_up(f"a backward input is on the {d} device")
                return
        kinds = [(k, v if k != "val" else None) for k, v in m]
        if self.bw_map is None:
            self.bw_map = m
            self.saved_idxs = sorted({v for k, v in m if k == "fw"})
            self.saved_set = set(self.saved_idxs)
        elif kinds != [(k, v if k != "val" else None) for k, v in self.bw_map]:
            self._warn("structure", "the backward takes its inputs from other places at another shape; that "
                                    "shape runs without a graph")
            return
        # The incoming gradients' layouts; the values that are not tensors
        # (a dynamic graph's sizes) are this shape's.
        self.learned[shape] = {i: (ops.layout(x), ops.shape_key(x)) for i, x in tangents.items()}
        self.learned_vals[shape] = {i: v for i, (k, v) in enumerate(m) if k == "val"}

    def _build(self, inputs: list, shape: Hashable) -> Optional[_TrainMember]:
        fw, bw, ops = self.fw, self.bw, self.ops
        if ops.views([]) is None:
            self._give_up("this torch cannot make tensors over a graph's outputs "
                          "(torch._C._construct_storage_from_data_pointer)")
            return None
        m = _TrainMember(shape)
        static = set(fw.static)
        args, ptrs, nbytes, inplace = [], [None] * len(inputs), 0, []
        with _lock:
            fixed = {p for p, owner in _fixed_outputs.items() if owner != id(self)}
        for i, x in enumerate(inputs):
            if i in static:
                args.append(x)
                ptrs[i] = ops.data_ptr(x)
            elif ops.is_tensor(x) and ops.data_ptr(x) in fixed:
                args.append(x)  # another captured graph's output: read in place
                ptrs[i] = ops.data_ptr(x)
                inplace.append(i)
            elif ops.is_tensor(x):
                p = ops.placeholder(x)
                ops.copy(p, x)
                args.append(p)
                nbytes += ops.nbytes(x)
            else:
                args.append(x)
        learned, vals = self.learned[shape], self.learned_vals[shape]
        bw_map, saved = self.bw_map, self.saved_set
        inner_fw, inner_bw = fw.inner, bw.inner
        # The recording pass's incoming gradients: zeros outside the arena,
        # dropped once the chain is planned (the backward's capture, at its
        # first call, reads the real ones in place or from placeholders).
        tan = m.tan
        for i, (layout, _) in learned.items():
            tan[i] = ops.empty(layout)
            ops.zero(tan[i])

        def forward(_box):
            return inner_fw(list(args))

        def backward(box):
            outs = box.pop()
            a = [outs[v] if kind == "fw" else args[v] if kind == "fwin" else tan[i] if kind == "tan" else vals[i]
                 for i, (kind, v) in enumerate(bw_map)]
            keep = [o for j, o in enumerate(outs) if j not in saved]  # the forward's other outputs stay live
            del outs
            r = inner_bw(a)
            del keep
            return r
        try:
            ch = ops.capture_chain([forward, backward], f"{self.name}:{len(self.members)}", fw.device, self.opts,
                                   capture=1)
        except Exception as e:  # noqa: BLE001 - any failure means: run without a graph
            self._give_up(f"capture failed: {type(e).__name__}: {e}")
            return None
        finally:
            tan.clear()
        m.chain, m.fw_args, m.fw_ptrs, m.bw_stage = ch, args, ptrs, backward
        m.fw_check, m.fw_inplace = sorted(static | set(inplace)), set(inplace)
        self._fix(ch.outputs[0])
        m.tangent_layouts = {i: layout for i, (layout, _) in learned.items()}
        m.tangent_keys = {i: key for i, (_, key) in learned.items()}
        m.make_fw = ops.views(ch.outputs[0])
        # The backward inputs that are the forward's device outputs: each
        # call checks they are the last forward replay's.
        m.saved_cuda = [i for i, (kind, v) in enumerate(bw_map)
                        if kind == "fw" and ops.device(ch.outputs[0][v])[0] == "cuda"]
        m.bw_ptrs = [None] * len(bw_map)
        for i, (kind, v) in enumerate(bw_map):
            if kind == "fw":
                p = ops.data_ptr(ch.outputs[0][v])
            elif kind == "fwin" and v in static:
                p = ptrs[v]
            else:
                continue
            m.bw_ptrs[i] = p
            m.bw_static.append(i)
        m.placeholder_bytes = nbytes
        self.members[shape] = m
        return m

    def _fix(self, outs: Sequence[Any]) -> None:
        """Note a captured stage's device outputs as this pair's fixed
        addresses (other graphs read them in place)."""
        ops = self.ops
        with _lock:
            for o in outs:
                if ops.is_tensor(o) and ops.device(o)[0] == "cuda":
                    _fixed_outputs[ops.data_ptr(o)] = id(self)

    def _capture_bw(self, m: _TrainMember, inputs: list) -> bool:
        """Capture m's backward at its first call: an incoming gradient at
        another captured graph's fixed output address, in its learned
        layout, is read there in place; others get a placeholder, copied
        into before each replay. False (with one warning, everything later
        without a graph) when the capture fails."""
        ops = self.ops
        with _lock:
            fixed = {p for p, owner in _fixed_outputs.items() if owner != id(self)}
        for i, layout in m.tangent_layouts.items():
            x = inputs[i]
            p = ops.data_ptr(x)
            if p in fixed and ops.layout(x) == layout:
                m.tan[i] = ops.at(p, layout)
                m.tangent_inplace[i] = p
            else:
                m.tan[i] = m.tangents[i] = ops.empty(layout)
        try:
            out = m.chain.capture(m.bw_stage)
        except Exception as e:  # noqa: BLE001 - any failure means: run without a graph
            m.tangents.clear()
            m.tangent_inplace.clear()
            self._give_up(f"capture of the backward failed: {type(e).__name__}: {e}")
            return False
        finally:
            m.tan.clear()
        self._fix(out)
        m.grad_ptrs = {ops.extent(t)[0] for t in out if ops.is_tensor(t)}
        m.make_bw = ops.views(out)
        m.placeholder_bytes += sum(ops.nbytes(t) for t in m.tangents.values())
        return True

    def report(self, r: _Runner) -> Dict[str, Any]:
        """Per part (forward or backward); the forward's also carries the
        chains' figures, summed over the shapes (one arena each)."""
        part = "forward" if r is self.fw else "backward"
        ms = [m for m in self.members.values() if m.chain is not None]
        out: Dict[str, Any] = {"graph": r.name, "training": part, "captured": bool(ms), "reason": self.reason,
                               "members": len(ms), "captures": len(ms), "replays": self.replays[part],
                               "plain_calls": self.plain[part],
                               "input_bytes_outside": sum(m.placeholder_bytes for m in ms),
                               "from_mode": self.opts.from_mode}
        if part == "backward":
            out["incoming_in_place"] = sum(len(m.tangent_inplace) for m in ms)
        if ms and part == "forward":
            reps = [m.chain.report() for m in ms]
            for k in ("arena", "lower_bound", "arena_mapped", "spill_held", "graph_bytes", "plan_build_ms"):
                if all(k in c for c in reps):
                    out[k] = sum(c[k] for c in reps)
            if out.get("lower_bound"):
                out["ratio"] = out["arena"] / out["lower_bound"]
            out["capture_ms"] = sum(sum(c.get("capture_ms", {}).values()) for c in reps)
        return out

    def close(self) -> None:
        for m in self.members.values():
            prev = [t for t in (w() for w in m.user_refs) if t is not None]
            if prev:
                self.ops.deny(prev)
            if m.chain is not None:
                m.chain.close()
                m.chain = None
        self.members.clear()
        with _lock:
            for p in [p for p, owner in _fixed_outputs.items() if owner == id(self)]:
                del _fixed_outputs[p]


def report() -> List[Dict[str, Any]]:
    """Per compiled graph, in compile order: whether it is captured (else the
    reason), members (shapes), arena and lower bound (bytes, of the
    family's largest member), graph bytes (arena mapped + spill held),
    input bytes outside (copies of inputs that are not parameters or
    buffers held outside the arena: a training graph's placeholders; an
    inference graph's copies are planned in its arena, ``input_bytes_planned``
    summed over its members), captures, plain calls (run without a graph)
    and replays; a training backward's ``incoming_in_place``: incoming
    gradients read where another captured graph made them. Costs one
    library call per captured graph."""
    return [r.report() for r in sorted(_runners, key=lambda r: r.order)]


def reset() -> None:
    """Destroy every graph the backend captured and give the arenas back
    (compiled code stays; its next calls capture again). Call outside any
    capture, with no output of those graphs in use."""
    for r in list(_runners):
        r.close()
        r.seen.clear()
        r.by_shape.clear()
        if r.reason is None:
            r.warned.clear()


# Why a graph cannot be captured, read from the FX graph before inductor lowers it.
def _graph_device(gm) -> Optional[int]:
    """The CUDA device of the graph's first tensor."""
    for n in gm.graph.nodes:
        v = n.meta.get("val", None)
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            return v.device.index if v.device.index is not None else torch.cuda.current_device()
    return None


def _graph_reason(gm, static_idxs: Sequence[int]) -> Optional[str]:
    devices, placeholders = {}, []
    for n in gm.graph.nodes:
        v = n.meta.get("val", None)
        if isinstance(v, torch.Tensor):
            d = v.device
            if d.type != "cuda":
                return f"tensors on the {d.type} device ({n.name})"
            devices.setdefault(d.index, n.name)
        if n.op == "placeholder":
            placeholders.append(n)
    if len(devices) > 1:
        return "tensors on several devices (" + ", ".join(f"cuda:{i}" for i in sorted(devices)) + ")"
    mutated = _mutated_inputs(gm, placeholders) - set(static_idxs)
    if mutated:
        names = ", ".join(placeholders[i].name for i in sorted(mutated) if i < len(placeholders))
        return f"inputs other than parameters and buffers are written in place ({names})"
    try:
        from torch._inductor.utils import get_first_incompatible_cudagraph_node
        node = get_first_incompatible_cudagraph_node(gm)
    except Exception:  # noqa: BLE001 - a torch without it: nothing more to check
        node = None
    if node is not None:
        return f"an operation CUDA graphs cannot hold ({node.name}: {node.target})"
    return None


def _mutated_inputs(gm, placeholders) -> set:
    """Indices of inputs an operation writes in place (schema alias info),
    through views of them too."""
    base = {}
    for i, n in enumerate(placeholders):
        base[n] = i
    out = set()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            continue
        for j, a in enumerate(schema.arguments):
            arg = n.args[j] if j < len(n.args) else n.kwargs.get(a.name)
            if arg is None or not hasattr(arg, "op"):
                continue
            if a.alias_info is not None and a.alias_info.is_write and arg in base:
                out.add(base[arg])
        # A view of an input is that input for what follows.
        if schema.returns and getattr(schema.returns[0], "alias_info", None) is not None and n.args:
            src = n.args[0]
            if hasattr(src, "op") and src in base:
                base[n] = base[src]
    return out


_ops: Optional[_Ops] = None


def _get_ops() -> _Ops:
    global _ops
    if _ops is None:
        _ops = _Ops()
    return _ops


def backend(gm, example_inputs, mode: Optional[str] = None, options: Optional[Dict[str, Any]] = None):
    """The dynamo backend: ``torch.compile(model, backend="arenaplan")``.

    Compiles with inductor (its own CUDA graphs off) and wraps every graph
    it compiles (see the module's documentation). Costs an inductor
    compile; the capture comes at a graph's ``warmup + 1``-th call. Call
    :func:`arenaplan.torch.install` before CUDA starts, or every graph runs
    without a CUDA graph (one warning says so).
    """
    opts = CompileOptions(mode, options)
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    ops = _get_ops()
    counter = [0]
    pairs: Dict[Any, _TrainPair] = {}  # training graphs by graph id: the forward compiles first

    def inner_compile(gm_, example_inputs_, **kw):
        static = list(kw.get("static_input_idxs") or ())
        backward = bool(kw.get("is_backward"))
        training = backward or not kw.get("is_inference", False)
        calls = sum(1 for n in gm_.graph.nodes if n.op == "call_function")
        reason = None
        if not opts.capture:
            reason = "capture=False"
        elif not ops.installed():
            reason = "arenaplan is not PyTorch's allocator (call arenaplan.torch.install() before CUDA starts)"
        else:
            reason = _graph_reason(gm_, static)
        device = _graph_device(gm_)
        mutated = _mutated_inputs(gm_, [n for n in gm_.graph.nodes if n.op == "placeholder"])
        compiled = compile_fx_inner(gm_, example_inputs_, **kw)
        mutated |= set(getattr(compiled, "mutated_input_idxs", None) or ())
        if calls == 0:
            return compiled
        gid = kw.get("graph_id")
        if gid is None:
            counter[0] += 1
            gid = f"_{counter[0]}"
        name = f"graph{gid}{'-bw' if backward else ''}"
        if training and reason != "capture=False":
            # A forward and its backward: captured together, as one chain.
            r = _Runner(compiled, name, static, None, opts, ops, device, mutated)
            if backward:
                pair = pairs.get(gid) or pairs.get("last")
                if pair is None or pair.bw is not None:
                    pair = _TrainPair(name, opts, ops)
                    pair._give_up("a backward whose forward this backend did not compile")
            else:
                pair = pairs[gid] = pairs["last"] = _TrainPair(name, opts, ops)
            r.pair = pair
            if backward:
                pair.bw = r
            else:
                pair.fw = r
            if reason is not None:
                r.reason = reason
                pair._give_up(f"{'backward' if backward else 'forward'}: {reason}")
            return r
        r = _Runner(compiled, name, static, None if reason == "capture=False" else reason, opts, ops, device,
                    mutated)
        if reason == "capture=False":
            r.reason = reason  # asked for: no warning
        return r

    patches = opts.inductor_patches(list_mode_options)
    # AOTAutograd's cache would hand back inductor's code without the
    # wrapper on a hit (its key does not see inner_compile): off here.
    import torch._functorch.config as fconfig
    ctx = fconfig.patch(enable_autograd_cache=False) if hasattr(fconfig, "enable_autograd_cache") else _null()
    with ctx:
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _register() -> None:
    try:
        from torch._dynamo.backends.registry import _BACKENDS, register_backend
    except ImportError:  # a torch without dynamo: nothing to register with
        return
    if NAME not in _BACKENDS:
        register_backend(compiler_fn=backend, name=NAME)


_register()
