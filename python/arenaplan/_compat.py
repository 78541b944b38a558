"""What PyTorch cannot do on a plugged allocator, done by arenaplan instead,
or refused where the user asks for it rather than deep inside PyTorch.

``torch.compile(mode="reduce-overhead")`` and ``mode="max-autotune"`` capture
with CUDAGraph Trees, which need the caching allocator's private pools and
checkpoint state; PyTorch's ``CUDAPluggableAllocator`` refuses those
(``checkPoolLiveAllocations``, ``getCheckpointState``), and the refusal
would come at the first call, from inside inductor. Libraries ask for
those modes on their users' behalf (Hugging Face ``generate`` with a static
cache compiles its forward with ``mode="reduce-overhead"``), so
:func:`install` routes such a request to the ``arenaplan`` backend: the
same inductor kernels (the mode's inductor options kept, its CUDA graphs
off), captured on a planned arena, with reduce-overhead's contract (a
call's outputs are overwritten by the same graph's next call, and reading
them after that raises the same error;
``torch.compiler.cudagraph_mark_step_begin()`` may be called). The
backend's report names the mode a graph was asked for (``from_mode``).
With routing off (``arenaplan.torch.install(reduce_overhead="refuse")``,
or ``ARENAPLAN_REDUCE_OVERHEAD=refuse``) the request raises
:class:`CUDAGraphTreesError` at once, naming what to use instead.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

from ._lib import ArenaplanError

# Modes whose inductor configuration turns CUDAGraph Trees on.
_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class CUDAGraphTreesError(ArenaplanError):
    """torch.compile was asked for CUDAGraph Trees under arenaplan."""


def _refusal(why: str) -> CUDAGraphTreesError:
    return CUDAGraphTreesError(
        f"arenaplan: torch.compile with {why} captures with CUDAGraph Trees, which need PyTorch's caching "
        "allocator (private pools, checkpoint state); arenaplan is installed as the allocator. Use "
        "torch.compile(model, backend=\"arenaplan\") for inductor's kernels captured on a planned arena "
        "(what such requests get unless arenaplan.torch.install(reduce_overhead=\"refuse\") or "
        "ARENAPLAN_REDUCE_OVERHEAD=refuse), or mode=\"max-autotune-no-cudagraphs\" / the default mode "
        "without CUDA graphs.")


def _wants_graph_trees(torch, kwargs) -> str:
    """Why a torch.compile call would use CUDAGraph Trees, or ""."""
    backend = kwargs.get("backend", "inductor")
    if backend not in ("inductor", None):
        return ""
    mode = kwargs.get("mode")
    if mode in _GRAPH_MODES:
        return f'mode="{mode}"'
    options = kwargs.get("options") or {}
    if options.get("triton.cudagraphs"):
        return 'options={"triton.cudagraphs": True}'
    if mode is None and not options:
        try:
            if torch._inductor.config.triton.cudagraphs:
                return "torch._inductor.config.triton.cudagraphs = True"
        except AttributeError:
            pass
    return ""


ROUTE, REFUSE = "arenaplan", "refuse"
_route = [ROUTE]


def routed(kwargs: Dict[str, Any], why: str) -> Dict[str, Any]:
    """torch.compile's arguments with a request for CUDAGraph Trees turned
    into one for the ``arenaplan`` backend: the mode and the other options
    passed on, CUDA graphs asked of inductor dropped (the backend's are
    arenaplan's), the request noted as ``from_mode``."""
    out = dict(kwargs)
    options = dict(out.pop("options", None) or {})
    options.pop("triton.cudagraphs", None)
    mode = out.pop("mode", None)  # torch.compile takes a mode or options, not both: it goes in the options
    options["from_mode"] = mode if mode else why
    out["backend"] = "arenaplan"
    out["options"] = options
    return out


def set_route(route: str) -> None:
    """What a request for CUDA graphs on PyTorch's allocator gets from now
    on: ``"arenaplan"`` (compiled on the backend) or ``"refuse"``."""
    if route not in (ROUTE, REFUSE):
        raise ValueError(f"arenaplan: reduce_overhead={route!r}: want {ROUTE!r} or {REFUSE!r}")
    _route[0] = route


def install(torch, route: str = ROUTE, register: Optional[Callable[[], None]] = None) -> None:
    """Wrap ``torch.compile`` so that a request for CUDAGraph Trees compiles
    on the ``arenaplan`` backend (``route="arenaplan"``; ``register``
    imports it) or raises :class:`CUDAGraphTreesError` when it is made
    (``route="refuse"``). Wraps once; a later call sets the route."""
    set_route(route)
    compile_ = torch.compile
    if getattr(compile_, "_arenaplan", False):
        return

    @functools.wraps(compile_)
    def compile(*args, **kwargs):
        why = _wants_graph_trees(torch, kwargs)
        if why:
            if _route[0] != ROUTE:
                raise _refusal(why)
            if register is not None:
                register()
            return compile_(*args, **routed(kwargs, why))
        return compile_(*args, **kwargs)

    compile._arenaplan = True
    torch.compile = compile
