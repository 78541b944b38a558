"""A family of steps captured into one planned arena: :func:`graphs` and
:class:`GraphFamily` (vLLM's and SGLang's batch-size graphs)."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch

from . import _state
from ._graph import (_capture, _capture_parts, _check_record, _record_eager, _recording_graph, _serve_capture, _warm_up,
                     capture_stream, warm_up_first)
from ._lib import ArenaplanError, Library


def _stream_key(device: int) -> Any:
    """What tells the device's current stream from another: PyTorch's
    (stream id, device, type) triple where it has the C call, which costs a
    replay about a microsecond against some twenty for the
    ``torch.cuda.Stream`` object that ``current_stream`` makes; else that
    object."""
    get = getattr(torch._C, "_cuda_getCurrentStream", None)
    return get(device) if get is not None else torch.cuda.current_stream(device)

class GraphFamily:
    """One step captured at several sizes (a decode step at batch sizes 1,
    2, 4, ...) into ONE arena planned for all of them: it is as large as the
    largest member needs, and the smaller members cost nothing more.

    Members never run concurrently: their memory overlaps by design, so a
    member's outputs are valid until the next replay of any member (clone
    what must survive), and are tensors that do not own their memory (as
    vLLM keeps its graphs' outputs): do not use them after :meth:`close`. :meth:`replay` orders a replay after the previous
    one when the current stream changed, so concurrency cannot happen
    through it. Tensors the members share (static inputs allocated at the
    largest size and sliced, weights, a KV cache) are made outside the
    family and used by every member at the same addresses.
    """

    def __init__(self, lib: Library, fid: int, graphs: Dict[Any, "torch.cuda.CUDAGraph"], outputs: Dict[Any, Any],
                 sids: Dict[Any, int], capture_ms: Dict[Any, float], plan_ms: float, device: int):
        self._lib, self._fid = lib, fid
        self._graphs, self.outputs, self._sids = graphs, outputs, sids
        self.capture_ms, self.plan_ms = capture_ms, plan_ms
        self.setup_ms = 0.0  # ap.graphs: the capture stream made ready and the family made
        self.warmup_ms: Dict[Any, float] = {}  # each member's warm-up runs (ap.graphs)
        self.record_ms: Dict[Any, float] = {}  # each member's recording run
        self.captures: Dict[Any, int] = {}  # each member's captures, the recording one included
        self.capture_parts_ms: Dict[Any, list] = {}  # per served capture: [entry, step, end]
        self._device = device
        self._last_stream = None  # the stream of the last replay, and its _stream_key
        self._last_key: Any = None

    @property
    def keys(self):
        """The members' keys, in capture order (largest first, then those added)."""
        return list(self._graphs)

    def replay(self, key, *, prepared: bool = False) -> Any:
        """Replay member ``key`` on the current stream; returns its outputs.
        Raises as :meth:`Graph.replay` does (closed, paused) and
        ``KeyError`` for an unknown key. ``prepared``: the caller called
        :meth:`prepare` just before (its checks are not made twice)."""
        if not prepared:
            self.prepare()
        g = self._graphs.get(key)
        if g is None:
            raise KeyError(f"arenaplan: no member {key!r} (members: {self.keys})")
        g.replay()
        return self.outputs[key]

    def prepare(self) -> None:
        """Raise as :meth:`replay` does (closed, paused), and order the
        current stream after the previous replay. Call it before writing
        into the arena outside a replay (inputs that a member allocates
        inside its step and that are copied to their planned addresses
        before each replay): the previous replay may still be using that
        memory, and a paused arena has none. :meth:`replay` calls it; it
        costs a read of the pause generation and a stream comparison."""
        if self._graphs is None:
            raise ArenaplanError(f"arenaplan: replay of a closed graph family (family {self._fid})")
        if self._lib.graphs_paused(self._device):
            raise ArenaplanError(f"arenaplan: the graphs' memory of device {self._device} is paused: "
                                 "arenaplan.torch.resume() first")
        key = _stream_key(self._device)
        if key != self._last_key:
            cur = torch.cuda.current_stream(self._device)
            if self._last_stream is not None:
                cur.wait_stream(self._last_stream)
            self._last_stream, self._last_key = cur, key

    def report(self) -> dict:
        """The family arena against the largest member's lower bound, and
        each member's report (plan, divergences, spill held)."""
        r = self._lib.family_report(self._fid)
        r["capture_ms"] = self.capture_ms
        r["setup_ms"] = self.setup_ms
        r["warmup_ms"] = self.warmup_ms
        r["record_ms"] = self.record_ms
        r["captures"] = self.captures
        r["capture_parts_ms"] = self.capture_parts_ms
        r["plan_build_ms"] = self.plan_ms
        r["spill_held"] = sum(m.get("spill_held", 0) for m in r["members"])
        r["graph_bytes"] = r["arena_mapped"] + r["spill_held"]
        return r

    def add(self, key, fn: Callable[[], Any], *, warmup: int = 2, strict: bool = False, budget: float = 1.0,
            stream: Optional["torch.cuda.Stream"] = None, around: Sequence[Tuple[int, int]] = ()) -> None:
        """Capture one more member into the family's arena as it is: its
        ``warmup`` eager runs (the last recorded), a plan of its own inside
        the arena, one capture (two where the capture allocated
        differently). The other members keep their addresses and graphs,
        and their outputs stay valid. Raises :class:`ArenaplanError` when
        its plan needs more than the arena ("does not fit in the family's
        arena": capture the family again, with it, largest first), when
        the members share buffers, or for a key already there; the family
        is then as it was.

        ``around``: device address ranges ``(start, end)`` the program
        holds in the family's arena while this member replays (another
        member's outputs that it reads or that live past it): its plan,
        and any plan of it made again, leaves them alone, so its replays
        never write there; where it then needs more than the arena, the
        arena grows in place (every address stays, the other members'
        graphs with it) instead of raising."""
        if self._graphs is None:
            raise ArenaplanError(f"arenaplan: add to a closed graph family (family {self._fid})")
        if key in self._graphs:
            raise ValueError(f"arenaplan: GraphFamily.add: member {key!r} is there already")
        _check_keys({**{k: None for k in self._graphs}, key: None})
        _state.check_budget(budget)
        if warmup < 1:
            raise ValueError(f"arenaplan: GraphFamily.add: warmup={warmup}: want >= 1 (the last run is recorded)")
        lib, dev = self._lib, self._device
        stream = capture_stream(dev, stream)
        _warm_up(fn, stream, warmup - 1)
        sid = lib.family_member(self._fid, str(key))
        t = time.perf_counter()
        try:
            _record_eager(lib, sid, fn, stream)
        except BaseException:
            lib.step_close(sid)
            raise
        self.record_ms[key] = (time.perf_counter() - t) * 1e3
        t1 = time.perf_counter()
        if around:  # on an error the member is closed and gone
            lib.family_plan_member_around(self._fid, sid, budget, list(around))
        else:
            lib.family_plan_member(self._fid, sid, budget)
        self.plan_ms += (time.perf_counter() - t1) * 1e3
        t = time.perf_counter()
        try:
            g, out, n = _serve_capture(lib, sid, fn, stream, strict, budget)
        except BaseException:
            lib.step_close(sid)
            raise
        self.outputs[key] = _weak(out)  # the other members' buffers overlap it by design
        del out
        self._graphs[key], self._sids[key] = g, sid
        torch.cuda.synchronize(dev)
        self.capture_ms[key] = (time.perf_counter() - t) * 1e3
        self.captures[key] = n
        self.capture_parts_ms[key] = list(_capture_parts)

    def replan_around(self, key, fn: Callable[[], Any], around: Sequence[Tuple[int, int]], *, strict: bool = False,
                      budget: float = 1.0, stream: Optional["torch.cuda.Stream"] = None) -> None:
        """Plan member ``key`` again so that it also leaves the device
        address ranges ``around`` alone (memory the program now holds in
        the arena across its replays: another member's outputs, kept by a
        loop), beside what its plan left alone before, its outputs kept at
        their addresses (the other members' plans avoid them), and capture
        it once more from ``fn``: one capture, two where it diverged. The
        arena grows in place where it needs more (every address stays).
        Costs a synchronize, a plan and a capture; call it between
        replays, outside a capture. :attr:`outputs` then holds the new
        capture's outputs.

        Raises :class:`ArenaplanError` where the library refuses (a range
        meets one of the member's outputs, or none lies in the arena): the
        member is captured again on its plan, as it was, first. Where a
        capture fails, the member leaves the family and the error is
        raised."""
        refused = []

        def replan(lib, sid):
            try:
                lib.family_replan_member_around(self._fid, sid, budget, list(around))
            except ArenaplanError as e:
                refused.append(e)  # the member keeps its plan: captured again on it
                lib.step_drop_captures(sid)
        self._again("replan", key, fn, replan, strict, budget, capture_stream(self._device, stream))
        if refused:
            raise refused[0]

    def recapture(self, key, fn: Callable[[], Any], *, strict: bool = False, budget: float = 1.0,
                  stream: Optional["torch.cuda.Stream"] = None) -> None:
        """Capture member ``key`` once more on its plan, from ``fn``: the same
        step reading other parameters or buffers of the same shapes (those
        it was captured with are gone). No eager run and no planning: one
        capture (two where it allocated differently, planned again inside
        the arena). Call it between replays, outside a capture, on the
        stream the member was captured on (default: a new one).
        :attr:`outputs` then holds the new capture's outputs. Where the
        capture fails, the member leaves the family and the error is
        raised."""
        self._again("recapture", key, fn, lambda lib, sid: lib.step_drop_captures(sid), strict, budget,
                    capture_stream(self._device) if stream is None else stream)

    def _again(self, what: str, key, fn: Callable[[], Any], prepare: Callable[[Library, int], None], strict: bool,
               budget: float, stream: "torch.cuda.Stream") -> None:
        """Member key's graph destroyed, prepare(lib, step) (its plan made
        again, or its capture pools given back), and the member captured
        once more from fn: see :meth:`replan_around`, :meth:`recapture`."""
        if self._graphs is None:
            raise ArenaplanError(f"arenaplan: {what} of a member of a closed graph family (family {self._fid})")
        old = self._graphs.get(key)
        if old is None:
            raise KeyError(f"arenaplan: no member {key!r} (members: {self.keys})")
        _state.check_budget(budget)
        lib, dev, sid = self._lib, self._device, self._sids[key]
        torch.cuda.synchronize(dev)  # no replay of it still runs: its graph and capture pools go
        old.reset()
        t1 = time.perf_counter()
        prepare(lib, sid)
        self.plan_ms += (time.perf_counter() - t1) * 1e3
        t = time.perf_counter()
        try:
            g, out, n = _serve_capture(lib, sid, fn, stream, strict, budget)
        except BaseException:
            del self._graphs[key], self._sids[key]
            self.outputs.pop(key, None)
            lib.step_close(sid)
            raise
        self.outputs[key] = _weak(out)
        del out
        self._graphs[key] = g
        torch.cuda.synchronize(dev)
        self.capture_ms[key] = (time.perf_counter() - t) * 1e3
        self.captures[key] = self.captures.get(key, 0) + n
        self.capture_parts_ms[key] = list(_capture_parts)

    def save(self, path: str) -> None:
        """Write the family plan (every member, one arena) to a plan file."""
        self._lib.family_save(self._fid, path)

    def close(self) -> None:
        """Destroy the graphs and give the arena back."""
        if self._graphs is not None:
            for g in self._graphs.values():
                g.reset()
            self._graphs, self.outputs = None, None
            self._lib.family_close(self._fid)


def graphs(fns: Dict[Any, Callable[[], Any]], *, plan: Optional[str] = None, warmup: int = 2, strict: bool = False,
           budget: float = 1.0, record: str = "auto", name: Optional[str] = None,
           device: Optional[int] = None, stream: Optional["torch.cuda.Stream"] = None) -> GraphFamily:
    """Capture a family of steps into one planned arena, like vLLM's and
    SGLang's batch-size graphs. ``fns`` maps a key (a batch size) to a step
    taking no arguments; members are captured in the dict's order (give
    the largest first, as engines do). Each member: ``warmup`` eager runs,
    the last one recorded (``record`` as in :func:`graph`), its plan
    started on other cores as the next members record; then one plan
    for all, taking those (``plan``: a family plan file, refused with
    :class:`PlanMismatchError` for another family); then one capture per
    member, two for a member whose capture allocated differently from its
    eager run (it is planned again from its capture, inside the family
    arena). ``stream``: the capture stream, as for :func:`graph`."""
    t0 = time.perf_counter()
    lib = _state.need()
    _state.check_budget(budget)
    dev = torch.cuda.current_device() if device is None else device
    if not fns:
        raise ArenaplanError("arenaplan.torch.graphs: no members")
    _check_keys(fns)
    eager_rec = plan is None and _check_record(record, warmup)
    stream = torch.cuda.Stream(device=dev) if stream is None else stream
    h = stream.cuda_stream
    fid = lib.family_new(dev, name or "family")
    setup_ms = (time.perf_counter() - t0) * 1e3
    sids, cap_ms, rec_ms, warm_ms, gs, outs, ncap = {}, {}, {}, {}, {}, {}, {}
    try:
        for i, (key, fn) in enumerate(fns.items()):
            t = time.perf_counter()
            n = warmup - 1 if eager_rec else warmup
            if i == 0:
                ws_ms = warm_up_first(fn, stream, n, dev)  # the stream's workspaces, around the first runs
                setup_ms += ws_ms
            else:
                ws_ms = 0.0
                _warm_up(fn, stream, n)
            warm_ms[key] = (time.perf_counter() - t) * 1e3 - ws_ms
            sids[key] = lib.family_member(fid, str(key))
        if plan is None:
            for key, fn in fns.items():
                t = time.perf_counter()
                if eager_rec:
                    _record_eager(lib, sids[key], fn, stream)
                else:
                    g0 = _recording_graph()
                    o = _capture(lib, sids[key], fn, stream, g0, lambda: lib.step_record(sids[key], h))
                    del o
                    g0.reset()
                # Planned on other cores while the next members record;
                # family_plan takes the plan (the largest member first
                # searches longest, the others stop under its peak).
                lib.family_plan_ahead(fid, sids[key], budget)
                rec_ms[key] = (time.perf_counter() - t) * 1e3
            t1 = time.perf_counter()
            lib.family_plan(fid, budget)
        else:
            t1 = time.perf_counter()
            lib.family_load(fid, plan)
        plan_ms = (time.perf_counter() - t1) * 1e3
        parts = {}
        for key, fn in fns.items():
            t = time.perf_counter()
            g, out, n = _serve_capture(lib, sids[key], fn, stream, strict, budget if eager_rec else None)
            # The next member's buffers overlap this one's outputs by design:
            # keep them as tensors that do not own their memory (vLLM's weak
            # references), so that no address is ever live twice.
            outs[key] = _weak(out)
            del out
            gs[key] = g
            torch.cuda.synchronize(dev)
            cap_ms[key] = (time.perf_counter() - t) * 1e3
            ncap[key] = n + (0 if eager_rec or plan is not None else 1)
            parts[key] = list(_capture_parts)
    except BaseException:
        _abandon(lib, fid, gs.values())
        raise
    fam = GraphFamily(lib, fid, gs, outs, sids, cap_ms, plan_ms, dev)
    fam.warmup_ms, fam.record_ms, fam.captures, fam.capture_parts_ms = warm_ms, rec_ms, ncap, parts
    fam.setup_ms = setup_ms
    return fam


def _abandon(lib: Library, fid: int, graphs: Iterable["torch.cuda.CUDAGraph"]) -> None:
    """Undo a family or chain whose capture failed: reset its graphs and
    close it (an error closing it is dropped: the capture's is raised)."""
    for g in graphs:
        g.reset()
    try:
        lib.family_close(fid)
    except ArenaplanError:
        pass


class _CudaArray:
    """Exposes device memory through __cuda_array_interface__ without
    owning it."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _weak(out: Any) -> Any:
    """``out`` with every CUDA tensor replaced by one over the same memory
    that does not own it (valid while the memory stays where it is)."""
    import torch.utils._pytree as pytree

    def weak(t):
        if not isinstance(t, torch.Tensor) or not t.is_cuda or t.numel() == 0:
            return t
        span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        raw = torch.as_tensor(_CudaArray(t.data_ptr(), span * t.element_size()), device=t.device)
        return raw.view(t.dtype).as_strided(t.shape, t.stride())
    return pytree.tree_map(weak, out)


def _check_keys(fns: Dict[Any, Any]) -> None:
    """Members are named by str(key) in the library and in plan files: two
    keys with one name (1 and "1") would collide there."""
    names: Dict[str, Any] = {}
    for key in fns:
        name = str(key)
        if name in names:
            raise ValueError(f"arenaplan.torch.graphs: keys {names[name]!r} and {key!r} have one name, "
                             f"{name!r} (members are named by str(key)): use keys that differ as strings")
        names[name] = key
