"""The library arenaplan.torch installed in this process, and the checks
every entry point shares (no torch import)."""
from __future__ import annotations

import math
from typing import Any, Optional

from ._lib import ArenaplanError, Library

lib: Optional[Library] = None  # set once by arenaplan.torch.install()


def need() -> Library:
    """The installed library, or ArenaplanError if install() did not run."""
    if lib is None:
        raise ArenaplanError("arenaplan.torch.install() was not called")
    return lib


_MAX_BUDGET_S = 3600.0  # the library's bridge.MaxBudget


def check_budget(budget: Any) -> None:
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


def device_index(torch: Any, device: Any) -> int:
    """The CUDA device ordinal a torch call names (None: the current one;
    an int; a torch.device or string such as "cuda:1")."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()
