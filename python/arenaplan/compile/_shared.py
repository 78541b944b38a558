"""What the inference and training wrappers share: the captured graphs of the
process, the blocks their captures run in (warm-up pools, runs the program
must not see), and one warning per kind."""
from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from typing import Any, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

from ._ops import _Ops

_runners: "weakref.WeakSet[Any]" = weakref.WeakSet()  # every _Runner of the process
# Addresses of the outputs of the training graphs captured so far, by the
# pair that owns them: a later graph whose input is one of them (the
# logits a loss graph takes from the model's graph) reads it in place, as
# CUDAGraph Trees read a parent graph's outputs, instead of copying it.
_fixed_outputs: Dict[int, int] = {}
_order = [0]
_lock = threading.Lock()


class _Pair(Protocol):
    """What a compiled graph asks of the training pair it belongs to (a
    forward and its backward, captured as one chain: _train._TrainPair)."""

    def call(self, runner: Any, inputs: list) -> Any: ...

    def report(self, runner: Any) -> Dict[str, Any]: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def _warm_pool(ops: "_Ops", device: Optional[int]):
    """A block in which a training graph's plain call before its capture
    allocates in a memory pool of its own, released when the call returns:
    each of its segments goes back once nothing made in it lives, instead
    of staying cached beside the arena, where the tensors made later (the
    optimizer's state, at the first step) would be placed among the step's
    freed activations and keep them mapped; as CUDAGraph Trees' warm-up
    runs in its graph's pool. The pool is one of graph memory: its segments
    are laid out in the graph heap at 512-byte boundaries, so that what the
    call leaves alive until the capture (its loss, a few bytes) shares a
    granule with the workspaces and the arena rather than holding one of
    its own; the granules its activations took go back before the arena
    is mapped. (An inference graph's warm-up
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


class _Outputs:
    """The tensors a captured stage returns, over its outputs' memory at
    fixed addresses. As CUDAGraph Trees do, the same tensor objects come
    back from replay to replay while nothing else holds them (a new tensor
    costs microseconds, per output and call: a training step's forward
    returns every saved activation); one still held when the stage
    replays again (the caller kept it or a view of it, autograd saved it,
    it is a parameter's ``.grad``) is replaced by a new one and, where the
    caller says so, made to raise when read (it is overwritten).

    ``cached``: register the tensors with autograd as cached outputs, so
    that AccumulateGrad takes a gradient as it would take a new tensor
    (without, the reference kept here makes it copy every gradient)."""

    __slots__ = ("ops", "makers", "slots", "tokens", "cached", "missing", "moved")

    def __init__(self, ops: "_Ops", outs: Sequence[Any], cached: bool = False):
        self.ops = ops
        self.makers = ops.output_makers(outs)  # per output: a maker, or None where the value is fixed
        self.slots: List[Any] = [None if mk is not None else o for mk, o in zip(self.makers, outs)]
        self.tokens: List[Any] = [None] * len(outs)  # per made tensor: what tells whether its memory is held
        self.cached = cached and ops.can_cache()
        self.missing = [i for i, mk in enumerate(self.makers) if mk is not None]  # the tensors to make
        self.moved = 0  # tensors moved out of the arena (see overwritten)

    def take(self, deny: Optional[Iterable[int]] = None) -> List[Any]:
        """The outputs after a replay: the tensors of the last one where
        nothing else holds them, new ones where something does (those held
        made unreadable where their index is in ``deny``; None: all)."""
        slots, tokens = self.slots, self.tokens
        held = self.ops.held_outputs(slots, tokens)
        if held:
            deny = None if deny is None else set(deny)
            for i in held:
                self._drop(i, deny is None or i in deny)
        if self.missing:
            for i in self.missing:
                slots[i], tokens[i] = self.makers[i]()
                if self.cached:
                    self.ops.set_cached(slots[i], True)
            self.missing = []
        return list(slots)

    def held(self) -> List[int]:
        """The indices of the tensors something else holds."""
        return self.ops.held_outputs(self.slots, self.tokens)

    def current(self, i: int) -> Any:
        return self.slots[i]

    def extra_refs(self, i: int) -> int:
        """References to output i's storage beside its tensor's when it was
        made (see :meth:`_Ops.move_out`)."""
        tok = self.tokens[i]
        return self.ops.extra_refs(tok) if tok is not None else 0

    def forget(self, i: int) -> None:
        """Drop output i's tensor without touching it (it was given memory
        of its own): the next take makes a new one."""
        self._drop(i, False)

    def uncache(self) -> None:
        """From now on, do not register the tensors as cached outputs."""
        if self.cached:
            for t, tok in zip(self.slots, self.tokens):
                if tok is not None:
                    self.ops.set_cached(t, False)
            self.cached = False

    def overwritten(self, spare: Sequence[Tuple[int, int]] = (), into: Optional[List[Tuple[int, int]]] = None) -> bool:
        """Another member of the family is about to write this memory: the
        tensors something holds are moved into memory of their own first,
        as CUDAGraph Trees keep one graph's live outputs from another's;
        the others stay, handed back at this member's next replay, which
        rewrites them. A held tensor whose memory lies inside one of the
        address ranges ``spare`` (what the writer's plan leaves alone)
        stays where it is. False where one cannot be moved (another tensor
        shares its memory: a view of it is held, which a move would leave
        behind): that one stays where it is, and the caller must not
        write there. ``into``: where given, the address ranges the moved
        tensors had are appended to it."""
        moved = True
        for i in self._exposed(spare):
            at = self.ops.extent(self.slots[i]) if into is not None else None
            if self._move_out(i):
                if at is not None:
                    into.append(at)
                self._drop(i, False)  # the program's now
                self.moved += 1
            else:
                moved = False
        return moved

    def exposed(self, spare: Sequence[Tuple[int, int]] = ()) -> List[Tuple[int, int]]:
        """The address ranges of the held tensors that :meth:`overwritten`
        would move out with the same ``spare``."""
        return [self.ops.extent(self.slots[i]) for i in self._exposed(spare)]

    def _exposed(self, spare: Sequence[Tuple[int, int]]) -> List[int]:
        """The indices of the held tensors not inside a range of spare."""
        held = self.held()
        if not spare:
            return held
        out = []
        for i in held:
            lo, hi = self.ops.extent(self.slots[i])
            if not any(a <= lo and hi <= b for a, b in spare):
                out.append(i)
        return out

    def release(self, deny: bool = True) -> None:
        """Drop every tensor, those held made unreadable (``deny``): the
        memory is about to be overwritten or given back."""
        held = set(self.held()) if deny else set()
        for i, tok in enumerate(self.tokens):
            if tok is not None:
                self._drop(i, i in held)

    def _move_out(self, i: int) -> bool:
        try:
            return self.ops.move_out([self.slots[i]], self.extra_refs(i))
        except RuntimeError:  # an inference tensor outside inference mode, say: it cannot move, so it is denied
            return False

    def _drop(self, i: int, deny: bool) -> None:
        t = self.slots[i]
        if self.cached:
            self.ops.set_cached(t, False)
        if deny:
            self.ops.deny([t])
        self.slots[i] = self.tokens[i] = None
        self.missing.append(i)
