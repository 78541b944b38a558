"""Memory snapshots and allocation history in PyTorch's format.

With arenaplan installed, ``torch.cuda.memory._snapshot``, ``_dump_snapshot``,
``memory_snapshot`` and ``_record_memory_history`` answer from arenaplan's
own state (the library's ``arenaplan_snapshot`` and
``arenaplan_record_history``), in the schema of PyTorch's caching
allocator, so that ``torch.cuda._memory_viz`` draws it and arenaplan's
``plan`` reads it back:

- each planned arena (a step's or a family's) is a segment whose blocks
  tile it as PyTorch's do (in address order, end to end, adding up to
  ``total_size``: memory_viz lays them so): the planned buffers live now,
  ``active_allocated``, and the free space between them, ``inactive``.
  Their frames name the step and the buffer (``arenaplan step <name>``,
  line = the buffer's index). Every planned buffer of the segment, live
  or not, is in the segment's extra key ``arenaplan_planned_blocks``
  (blocks of the same shape; buffers whose lifetimes do not overlap share
  addresses, so these overlap). PyTorch's tools ignore the key.
- each spill segment (the default pool, graph captures' pools, tagged
  regions) is a segment with its blocks; a region's segment has the pool
  id ``(0, id)`` and a frame naming its tag.
- while history is recorded, ``device_traces`` holds the allocator's
  events: ``alloc``, ``free_requested`` + ``free_completed``,
  ``segment_alloc`` / ``segment_free`` of spill segments and of planned
  arenas' regions (mapped or closed while recording), ``segment_map`` /
  ``segment_unmap`` of the range at the end of one grown or shrunk in
  place (as PyTorch's expandable segments record it), ``oom``.

With ``_record_memory_history(stacks="python")`` or ``"all"`` (the
default), the library calls back after each recorded allocation and the
Python stack of the allocating thread is kept (innermost first, at most
``MAX_FRAMES`` frames): the ``alloc`` entries and the live blocks they made
carry it as ``frames``, after the synthetic frame of a planned buffer
(``free_*`` entries carry none; C++ frames are not gathered). Blocks
allocated before recording began have none, as in PyTorch. With history
off nothing is called back.

Nothing here imports torch: ``install`` is given the module.
"""
import atexit
import collections
import ctypes
import json
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

# Bounds of the library's history ring (bridge.MaxHistoryEntries).
MAX_HISTORY_ENTRIES = 1 << 24

_ARENA_FILE = "arenaplan step"
_REGION_FILE = "arenaplan region"

# The key of an arena segment that lists every planned buffer in it.
PLANNED_BLOCKS = "arenaplan_planned_blocks"


# The deepest Python stack kept per allocation.
MAX_FRAMES = 64

_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint64)


class _Stacks:
    """The Python stacks of recorded allocations by (device, seq), the
    newest ``max`` kept; equal stacks are stored once."""

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.by_seq: Dict[Tuple[int, int], tuple] = {}
        self.order: collections.deque = collections.deque()
        self.interned: Dict[tuple, tuple] = {}
        self.max = 0
        self.hook = _HOOK(self._record)  # kept alive while the library may call it
        self.exit_hooked = False

    def _record(self, device: int, seq: int) -> None:
        try:
            f = sys._getframe(1)  # the frame that called into the allocator
        except ValueError:
            return
        frames = []
        while f is not None and len(frames) < MAX_FRAMES:
            code = f.f_code
            frames.append((code.co_filename, f.f_lineno or 0, code.co_name))
            f = f.f_back
        stack = tuple(frames)
        with self.mu:
            stack = self.interned.setdefault(stack, stack)
            key = (device, seq)
            self.by_seq[key] = stack
            self.order.append(key)
            while len(self.order) > self.max > 0:
                self.by_seq.pop(self.order.popleft(), None)

    def clear(self) -> None:
        with self.mu:
            self.by_seq.clear()
            self.order.clear()
            self.interned.clear()

    def frames(self, device: int, seq: int) -> List[Dict[str, Any]]:
        with self.mu:
            stack = self.by_seq.get((device, seq), ())
        return [{"filename": fn, "line": line, "name": name} for fn, line, name in stack]


_STACKS = _Stacks()


def record_stacks(lib, enabled: bool, max_entries: int = 0) -> None:
    """Keeps (or stops keeping, dropping those kept) the Python stack of
    each allocation recorded in the history, the newest ``max_entries``."""
    if not enabled:
        lib._lib.arenaplan_history_hook(None)
        _STACKS.clear()
        return
    _STACKS.max = max(int(max_entries or 0), 0)
    if not _STACKS.exit_hooked:
        # No call into a finalizing interpreter: the hook goes before it.
        atexit.register(lib._lib.arenaplan_history_hook, None)
        _STACKS.exit_hooked = True
    lib._lib.arenaplan_history_hook(ctypes.cast(_STACKS.hook, ctypes.c_void_p))


def raw_snapshot(lib, device: int) -> Dict[str, Any]:
    """The library's snapshot of ``device`` (bridge.Snapshot as JSON)."""
    out = ctypes.c_void_p()
    lib.check(lib._lib.arenaplan_snapshot(device, ctypes.byref(out)))
    text = lib._take(out.value)
    if text is None:
        raise RuntimeError(f"arenaplan: snapshot of device {device}: the library returned nothing")
    return json.loads(text)


def record_history(lib, enabled: bool, max_entries: int = 0) -> None:
    """Turns the library's history on (the newest ``max_entries`` events per
    device, clamped to MAX_HISTORY_ENTRIES; 0: the library's default) or off
    (dropping what was recorded)."""
    n = 0 if max_entries is None else max(0, min(int(max_entries), MAX_HISTORY_ENTRIES))
    lib.check(lib._lib.arenaplan_record_history(1 if enabled else 0, n))


def _frames_of_block(b: Dict[str, Any]) -> List[Dict[str, Any]]:
    name = b.get("name")
    if not name:
        return []
    step, _, buf = name.rpartition("/")
    line = int(buf[1:]) if buf[1:].isdigit() else 0
    return [{"filename": f"{_ARENA_FILE} {step}", "line": line, "name": buf}]


def _torch_block(b: Dict[str, Any], stack: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    return {"address": int(b["address"]), "size": int(b["size"]), "requested_size": int(b.get("requested_size", 0)),
            "state": b["state"], "frames": _frames_of_block(b) + (stack or [])}


def _block_stack(device: int, live: Dict[int, int], b: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    """The Python stack of the allocation that made live block b, if kept."""
    seq = live.get(int(b["address"])) if b["state"] == "active_allocated" else None
    return _STACKS.frames(device, seq) if seq else None


def _live_allocs(raw: Dict[str, Any]) -> Dict[int, int]:
    """The seq of the alloc entry that made each block live at the end of
    the recorded history, by address."""
    live: Dict[int, int] = {}
    for e in raw.get("trace") or []:
        a = int(e["addr"])
        if e["action"] == "alloc":
            live[a] = int(e.get("seq", 0))
        elif e["action"] == "free_completed":
            live.pop(a, None)
    return live


def torch_segments(raw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The segments of one device's raw snapshot as PyTorch's snapshot
    segments (keys and value types of torch.cuda.memory._snapshot; an
    arena's also ``arenaplan_planned_blocks``). ``allocated_size``,
    ``active_size`` and ``requested_size`` count the segment's blocks."""
    device = int(raw["device"])
    live = _live_allocs(raw) if _STACKS.by_seq else {}
    out = []
    for s in raw.get("segments") or []:
        blocks = []  # they tile the segment
        allocated = active = requested = 0
        for b in s.get("blocks") or []:
            state = b["state"]
            size, req = int(b["size"]), int(b.get("requested_size", 0))
            if state == "active_allocated":
                allocated += size
                active += size
                requested += req
            elif state == "active_pending_free":
                active += size
            blocks.append(_torch_block(b, _block_stack(device, live, b)))
        frames = []
        kind, owner = s.get("kind"), s.get("owner")
        if kind == "arena" and owner:
            frames = [{"filename": "arenaplan arena", "line": 0, "name": owner}]
        elif kind == "region" and owner:
            frames = [{"filename": _REGION_FILE, "line": 0, "name": owner}]
        pool = s.get("pool") or [0, 0]
        seg = {
            "device": device,
            "address": int(s["address"]),
            "total_size": int(s["total_size"]),
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            "stream": int(s.get("stream", 0)),
            "segment_type": "small" if s.get("small") else "large",
            "segment_pool_id": (int(pool[0]), int(pool[1])),
            "is_expandable": False,
            "frames": frames,
            "blocks": blocks,
        }
        if kind == "arena":
            seg[PLANNED_BLOCKS] = [_torch_block(b, _block_stack(device, live, b)) for b in s.get("planned_blocks") or []]
        out.append(seg)
    return out


def torch_trace(raw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The history of one device's raw snapshot as PyTorch's trace entries."""
    device = int(raw["device"])
    out = []
    for e in raw.get("trace") or []:
        frames = []
        if e.get("step") and int(e.get("buffer", -1)) >= 0:
            k = int(e["buffer"])
            frames = [{"filename": f"{_ARENA_FILE} {e['step']}", "line": k, "name": f"t{k}"}]
        if e["action"] == "alloc" and e.get("seq"):
            frames = frames + _STACKS.frames(device, int(e["seq"]))
        out.append({
            "action": e["action"],
            "addr": int(e["addr"]),
            "size": int(e["size"]),
            "stream": int(e.get("stream", 0)),
            "time_us": int(e["time_us"]),
            "compile_context": "N/A",
            "user_metadata": "",
            "frames": frames,
        })
    return out


def allocator_settings() -> Dict[str, Any]:
    """PyTorch's allocator_settings entry, as arenaplan is configured (no
    caching-allocator options apply)."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "graph_capture_record_stream_reuse": False,
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
    }


def torch_snapshot(lib, device_count: int, pool: Optional[Tuple[int, int]] = None,
                   include_traces: bool = True) -> Dict[str, Any]:
    """PyTorch's snapshot dict of every device below ``device_count``
    (devices arenaplan never used are empty): ``segments``,
    ``device_traces`` (one list per device), ``allocator_settings``,
    ``external_annotations``. ``pool`` other than None or (0, 0) keeps only
    that pool's segments."""
    segments, traces = [], []
    for d in range(max(int(device_count), 0)):
        raw = raw_snapshot(lib, d)
        segs = torch_segments(raw)
        if pool is not None and tuple(pool) != (0, 0):
            segs = [s for s in segs if s["segment_pool_id"] == tuple(pool)]
        segments += segs
        traces.append(torch_trace(raw) if include_traces else [])
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": allocator_settings(), "external_annotations": []}


def _history_entries(max_entries) -> int:
    if max_entries is None or max_entries >= sys.maxsize:
        return MAX_HISTORY_ENTRIES
    return max(1, min(int(max_entries), MAX_HISTORY_ENTRIES))


def install(lib, torch) -> None:
    """Redirects PyTorch's snapshot and history bindings to arenaplan:
    ``torch._C._cuda_memorySnapshot``, ``_cuda_record_memory_history`` and
    ``_cuda_record_memory_history_legacy`` (torch.cuda.memory looks them up
    at call time, so ``_snapshot``, ``_dump_snapshot``, ``memory_snapshot``
    and ``_record_memory_history`` all reach these). ``lib`` is the
    ``arenaplan._lib.Library``, ``torch`` the torch module."""
    C = torch._C

    def device_count() -> int:
        try:
            return int(torch.cuda.device_count())
        except Exception:  # noqa: BLE001 - no CUDA: describe device 0 only
            return 1

    def memory_snapshot(arg=None, *rest):
        pool, include_traces = None, True
        if isinstance(arg, (tuple, list)):
            if len(arg) >= 2:
                pool = (int(arg[0]), int(arg[1]))
            if len(arg) >= 3:
                include_traces = bool(arg[2])
        return torch_snapshot(lib, device_count(), pool, include_traces)

    def record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                              clear_history=False, compile_context=False, global_record_annotations=False,
                              skip_actions=None, *rest):
        if enabled is None:
            record_stacks(lib, False)
            record_history(lib, False)
            return
        if enabled not in ("all", "state"):
            raise ValueError(f"_record_memory_history: enabled={enabled!r}: want None, 'state' or 'all'")
        if clear_history:
            record_stacks(lib, False)
            record_history(lib, False)
        if enabled == "state":
            # The state (segments and blocks) is always there; no trace.
            record_stacks(lib, False)
            record_history(lib, False)
            return
        n = _history_entries(max_entries)
        record_stacks(lib, stacks in ("python", "all"), n)
        record_history(lib, True, n)

    def record_memory_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                                     trace_alloc_record_context=False, record_context_cpp=False,
                                     clear_history=False, compile_context=False,
                                     global_record_annotations=False, *rest):
        if not enabled:
            record_stacks(lib, False)
            record_history(lib, False)
            return
        if clear_history:
            record_stacks(lib, False)
            record_history(lib, False)
        n = _history_entries(max(int(trace_alloc_max_entries or 1), 1))
        record_stacks(lib, bool(record_context), n)
        record_history(lib, True, n)

    C._cuda_memorySnapshot = memory_snapshot
    C._cuda_record_memory_history = record_memory_history
    C._cuda_record_memory_history_legacy = record_memory_history_legacy
