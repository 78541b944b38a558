"""Repeated eager steps at the same addresses: :func:`eager` and
:class:`EagerStep`."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from . import _state
from ._graph import _run
from ._lib import Library

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
    lib = _state.need()
    _state.check_budget(budget)
    dev = torch.cuda.current_device() if device is None else device
    return EagerStep(lib, fn, warmup, strict, budget, name or getattr(fn, "__name__", "step"), dev)
