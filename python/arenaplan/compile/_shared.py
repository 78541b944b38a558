"""What the inference and training wrappers share: the captured graphs of the
process, the blocks their captures run in (warm-up pools, runs the program
must not see), and one warning per kind."""
from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from ._ops import _Ops

if TYPE_CHECKING:
    from ._infer import _Runner

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
