"""PyTorch's memory statistics answered by arenaplan.

A plugged allocator switches PyTorch's statistics off (its bindings raise
"CUDAPluggableAllocator does not yet support getDeviceStats"). :func:`install`
puts arenaplan's answers behind the same bindings, in PyTorch's schema, at
the lowest layer Python callers reach: ``torch.cuda.memory`` looks each
binding up on ``torch._C`` at call time, so ``memory_stats``,
``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
``max_memory_reserved``, ``memory_summary``, ``reset_peak_memory_stats`` and
``reset_accumulated_memory_stats`` all answer, also for code that imported
them before ``install()``; so do ``torch.accelerator``'s. The counts are kept
in C on every allocation (no call into Go); a statistics call costs one
call into the library.
"""
from __future__ import annotations

import ctypes
import json
from typing import Any, Dict

from ._state import device_index

# The bindings replaced: torch._C name -> what answers it.
_STATS = ("_cuda_memoryStats", "_accelerator_getDeviceStats")
_RESET_PEAK = ("_cuda_resetPeakMemoryStats", "_accelerator_resetPeakStats")
_RESET_ACC = ("_cuda_resetAccumulatedMemoryStats", "_accelerator_resetAccumulatedStats")


class Stats:
    """The statistics exports of a loaded library (``Library``)."""

    def __init__(self, lib) -> None:
        self._lib = lib

    def memory_stats(self, device: int) -> Dict[str, Any]:
        """Device's statistics as PyTorch's nested dict (before flattening)."""
        out = ctypes.c_void_p()
        self._lib.check(self._lib._lib.arenaplan_memory_stats(device, ctypes.byref(out)))
        return json.loads(self._lib._take(out))

    def reset_peak(self, device: int) -> None:
        self._lib.check(self._lib._lib.arenaplan_reset_peak_stats(device))

    def reset_accumulated(self, device: int) -> None:
        self._lib.check(self._lib._lib.arenaplan_reset_accumulated_stats(device))


def install(lib, torch) -> Stats:
    """Answer PyTorch's statistics bindings with ``lib``'s counts."""
    stats = Stats(lib)
    answers = {}
    for name in _STATS:
        answers[name] = lambda device=None: stats.memory_stats(device_index(torch, device))
    for name in _RESET_PEAK:
        answers[name] = lambda device=None: stats.reset_peak(device_index(torch, device))
    for name in _RESET_ACC:
        answers[name] = lambda device=None: stats.reset_accumulated(device_index(torch, device))
    # torch.accelerator.memory_stats answers {} until the allocator says it
    # is initialised, which a plugged one never does: it is once CUDA is.
    answers["_accelerator_isAllocatorInitialized"] = lambda: bool(torch.cuda.is_initialized())
    for name, fn in answers.items():
        if hasattr(torch._C, name):
            setattr(torch._C, name, fn)
    return stats
