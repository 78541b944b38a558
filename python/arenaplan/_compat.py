"""What PyTorch cannot do on a plugged allocator, refused where the user asks
for it rather than deep inside PyTorch.

``torch.compile(mode="reduce-overhead")`` and ``mode="max-autotune"`` capture
with CUDAGraph Trees, which need the caching allocator's private pools and
checkpoint state; PyTorch's ``CUDAPluggableAllocator`` refuses those
(``checkPoolLiveAllocations``, ``getCheckpointState``), and the refusal used
to come at the first call, from inside inductor. :func:`install` makes
``torch.compile`` refuse such a request at once, naming what to use
instead: ``backend="arenaplan"`` (inductor's kernels, captured on a planned
arena) or a mode without CUDA graphs.
"""
from __future__ import annotations

import functools

from ._lib import ArenaplanError

# Modes whose inductor configuration turns CUDAGraph Trees on.
_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class CUDAGraphTreesError(ArenaplanError):
    """torch.compile was asked for CUDAGraph Trees under arenaplan."""


def _refusal(why: str) -> CUDAGraphTreesError:
    return CUDAGraphTreesError(
        f"arenaplan: torch.compile with {why} captures with CUDAGraph Trees, which need PyTorch's caching "
        "allocator (private pools, checkpoint state); arenaplan is installed as the allocator. Use "
        "torch.compile(model, backend=\"arenaplan\") for inductor's kernels captured on a planned arena, "
        "or mode=\"max-autotune-no-cudagraphs\" / the default mode without CUDA graphs.")


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


def install(torch) -> None:
    """Wrap ``torch.compile`` so that a request for CUDAGraph Trees raises
    :class:`CUDAGraphTreesError` when it is made. Idempotent."""
    compile_ = torch.compile
    if getattr(compile_, "_arenaplan", False):
        return

    @functools.wraps(compile_)
    def compile(*args, **kwargs):
        why = _wants_graph_trees(torch, kwargs)
        if why:
            raise _refusal(why)
        return compile_(*args, **kwargs)

    compile._arenaplan = True
    torch.compile = compile
