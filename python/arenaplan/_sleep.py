"""Sleep and wake: regions whose device memory :func:`pause` releases and
:func:`resume` maps back at the same addresses (torch_memory_saver's
surface)."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

import torch

from . import _state

@contextlib.contextmanager
def region(tag: str, *, backup: bool = False, device: Optional[int] = None) -> Iterator[None]:
    """Allocations this thread makes inside the block (outside graph
    captures) belong to region ``tag``: :func:`pause` releases their device
    memory and :func:`resume` maps it back at the same addresses, restoring
    the contents when ``backup`` (kept in page-locked host memory from one
    pause to the next), dropping them otherwise. torch_memory_saver's
    ``region(tag=..., enable_cpu_backup=...)``."""
    lib = _state.need()
    dev = torch.cuda.current_device() if device is None else device
    tid = threading.get_native_id()
    lib.region_begin(dev, tid, tag, backup)
    try:
        yield
    finally:
        lib.region_end(dev, tid)


def pause(*tags: str, device: Optional[int] = None) -> None:
    """Release the device memory of the regions named (``"graphs"``: every
    captured graph's arena and pools; none: everything), keeping every
    address: tensors and graphs are valid again after :func:`resume`.
    Waits for the device. Pausing a paused tag raises; so does replaying a
    graph while ``"graphs"`` is paused on its device. A pause that fails
    half way is undone, or its error names what stays paused (as
    :func:`paused_tags` does). Freeing a paused tensor is fine.
    NCCL: graphs that registered user buffers (``NCCL_GRAPH_REGISTER=1``)
    keep stale registrations after a same-address resume; capture with
    ``NCCL_GRAPH_REGISTER=0``."""
    lib = _state.need()
    dev = torch.cuda.current_device() if device is None else device
    lib.pause(dev, list(tags))


def resume(*tags: str, device: Optional[int] = None) -> None:
    """Map the memory of the paused regions named (none: everything paused)
    back at the same addresses and restore the backed-up ones."""
    lib = _state.need()
    dev = torch.cuda.current_device() if device is None else device
    lib.resume(dev, list(tags))


def paused(tag: str = "graphs", *, device: Optional[int] = None) -> bool:
    """Whether ``tag`` (default: the graphs' memory, whose replays are then
    refused) is paused on the device, as the library holds it."""
    return tag in paused_tags(device=device)


def paused_tags(*, device: Optional[int] = None) -> frozenset:
    """The tags paused on the device (``"graphs"`` among them when the
    graphs' memory is), as the library holds them."""
    lib = _state.need()
    dev = torch.cuda.current_device() if device is None else device
    return lib.paused(dev)
