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
inductor's code as it is (autotuning, lazy state) on the capture stream,
as CUDAGraph Trees warm up on their graphs' stream, so that their matrix
products use the captures' workspaces (below) rather than make the
program stream's beside them; the next call
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
outputs do (views made of them do not raise: clone what must survive).
While nothing holds them, the same output tensors are handed back from
call to call (as CUDAGraph Trees do; making them anew costs microseconds
per output and call); one still held is replaced by a new tensor before
the call returns. ``torch.compiler.cudagraph_mark_step_begin()``
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
A call at a captured shape whose parameters or buffers are elsewhere (a
static KV cache made anew for each Hugging Face ``generate`` call) is
captured as a member too. Members hold no parameter or buffer alive; where
a member of the call's shape has lost its parameters or buffers and the
call's have the same shapes, that member is captured once more on its plan
with the call's (:meth:`GraphFamily.recapture`: one capture, no eager run
and no planning, as CUDAGraph Trees record again for new static
addresses); at the limit, members whose buffers are gone make room: the
family is captured anew without them.
A new shape that fits in the family's arena (a smaller one after a larger)
joins it with one capture of its own (:meth:`GraphFamily.add`); one that
does not re-captures the family, every member once more, largest first.
Members share the arena, so a call at one shape writes where the last call
at another left its outputs: those the program still holds are first moved
into memory of their own (a copy each, only then), as CUDAGraph Trees keep
one graph's live outputs from another's; so are they when the family is
captured anew. One of which the program holds a view cannot be moved (the
view would stay behind): while it is held, the calls that would overwrite
it or give its memory back run inductor's code without a graph (one
warning), and replays resume once it is released.

Training: AOTAutograd's forward and backward of a graph are captured
together as ONE chain (:func:`arenaplan.torch.chain`) after one plain
forward and backward at a shape (each in a memory pool of its own, laid out
in the graph heap and released when it returns, so that its activations'
memory becomes the arena's rather than stay cached beside it): one arena planned on one
timeline, the activations the forward saves read in place by the backward
and their memory reused once it frees them. The backward is captured at its
first call, when its incoming gradients are there: one that another captured
graph's backward made (a loss graph's gradient of the logits) is read in
place, as CUDAGraph Trees read it; others are copied into placeholders. So
is a chain's output that a graph without a backward takes at its first
capture (the gradients a compiled optimizer step reads): read in place,
checked by address as parameters are, neither planned in that graph's arena
nor copied at every call. Each
shape (the last, partial batch of an epoch) gets its own chain, up to
``max_shapes``. Gradients the backward returned that are still held at the
chain's next call (AccumulateGrad keeps one as ``.grad`` when the parameter
had none: gradient accumulation, ``zero_grad(set_to_none=False)``) are moved
out of the arena first, and from then on the backward's outputs are no
longer registered with autograd as cached outputs, so that AccumulateGrad
copies them into a ``.grad`` of its own: such loops replay. A forward while that shape's previous backward
is still pending runs inductor's code without a graph (one warning); a
backward whose saved activations a later forward overwrote raises. See
:class:`_TrainPair`.

Memory: where each byte of a process is. The program's own tensors
(weights, optimizer state, what it holds) are where its allocations put
them, in arenaplan's spillover caching allocator. Each compiled graph holds
one arena for all its shapes (the lower bound of its largest member's live
bytes, in 2 MiB pages; one of at most 16 MiB is laid out at 512-byte
boundaries in the device's graph heap, whose 2 MiB pages it shares with the
other small arenas, the workspaces and the plain training calls' pools),
the outputs that live across calls inside it. The
capture stream's cuBLAS and cuBLASLt workspaces (one per handle and stream
in PyTorch, 32 MiB each on Hopper) are made in a pool of that stream's,
after PyTorch's workspaces are dropped, so that the threads that capture on
it (a forward in the program's, its backward in autograd's) take turns on
one workspace's memory, kept for the graphs; dropping PyTorch's there
also drops those the plain calls before made on the program's stream, as
CUDAGraph Trees do around a warm-up. Before the runs of a capture (warm-up,
recorded), what the program's stream left cached goes back to the device,
and before the arena is mapped, what those runs left cached does too: the
peak of a capture is the larger of those runs' own and the arena's, beside
the program's tensors, not their sum. The graphs compiled from one frame of
the program (each size of a model compiled with ``dynamic=False``, a
recompilation after a guard failed) share one arena, planned jointly, as
one graph's shapes do. Graphs of other frames (either side of a graph
break, several compiled modules) join that arena too: a graph whose first
capture comes right after another frame's replay, on the same device and
thread. One that joins while the program holds outputs of the arena's
graphs, or that reads one (``head(body(x))``: the head takes the body's
output), is planned around them: its buffers avoid that memory over its
whole run, so it reads the output where it lies and nothing is moved out,
and the arena grows in place where it needs more room (every address
stays). The arena is then about the largest need plus what lives from one
graph to the next, not the sum. An output held across the replay of a
graph that was not planned around it (in a loop, the head's output still
held when the body runs again) is moved out first, as between shapes
(counted in the report's ``outputs_moved_out``); when the next replay
would move it out again, that graph is planned again around it, its own
outputs where they were, and captured once more (at most twice per
graph), so a loop pays one copy, not one per step. See
``_infer._Group``; option ``share_frames=False`` keeps every frame's arena
apart.

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
(False: never capture, for comparisons), ``share_frames`` (default True:
graphs of other frames may share an arena, see above); every other key is an inductor
config patch (``"max_autotune": True``, ...).

Registered at import with ``torch._dynamo.register_backend``; installed
packages also reach it through the ``torch_dynamo_backends`` entry point
``arenaplan = "arenaplan.compile:backend"``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

try:
    import torch  # noqa: F401 - a clear error where it is missing; the parts use it
except ModuleNotFoundError as _err:  # say what to do, not only what is missing
    from .._lib import torch_missing

    raise torch_missing("arenaplan.compile", _err) from None

# The parts, by what they run; tests and benchmarks reach the private ones here.
from ._fx import _graph_device, _graph_reason, _mutated_inputs  # noqa: F401
from ._infer import _Runner
from ._ops import _no_fill, _Ops  # noqa: F401
from ._options import NAME, CompileOptions
from ._shared import _fixed_outputs, _runners  # noqa: F401
from ._train import _TrainPair

__all__ = ["backend", "report", "reset", "CompileOptions"]


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
    frame = _frame_id()
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
                    mutated, frame)
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


def _frame_id() -> Optional[int]:
    """The program's frame dynamo compiles now (its recompilations share
    it), or None where this torch does not say."""
    try:
        from torch._guards import CompileContext
        cid = CompileContext.current_compile_id()
    except Exception:  # noqa: BLE001 - an older or newer torch: graphs keep arenas of their own
        return None
    return getattr(cid, "frame_id", None)


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
