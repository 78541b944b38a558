"""Why a graph cannot be captured, read from the FX graph before inductor
lowers it."""
from __future__ import annotations

from typing import Optional, Sequence

try:
    import torch
except ModuleNotFoundError as _err:  # say what to do, not only what is missing
    from .._lib import torch_missing

    raise torch_missing("arenaplan.compile", _err) from None

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
