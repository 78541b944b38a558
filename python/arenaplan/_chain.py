"""Steps that run in turn and hand tensors on, captured into one arena
planned on one timeline: :func:`chain` and :class:`GraphChain` (a forward
and its backward)."""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence

import torch

from . import _family, _state
from ._family import GraphFamily
from ._graph import _capture, _run, capture_stream, workspaces
from ._lib import ArenaplanError


class GraphChain(GraphFamily):
    """Stages captured into ONE arena planned on one timeline: stage i's
    outputs that stage i+1 frees are read by it in place and their memory
    is reused after that free; outputs no later stage frees stay valid
    until that stage replays again. Stages replay in order (0, 1, ..., 0,
    1, ...): replaying them out of order overwrites memory a later stage
    still reads. A family whose members are the stages, keyed 0, 1, ...:
    :meth:`replay`, :meth:`report` and :meth:`close` as a family's, the
    report's lower bound the peak of the joint timeline; chains are not
    written to plan files. Outputs are tensors that do not own their
    memory: do not use them after :meth:`close`.

    Stages the chain was made without capturing (``chain(capture=k)``)
    are captured by :meth:`capture`, in order, once the stages before them
    have run: a backward at its first call, when the addresses of its
    incoming gradients are known."""

    _pending: Optional["_Pending"] = None

    @property
    def captured(self) -> int:
        """How many stages are captured (0, 1, ...: the first ones)."""
        return len(self._graphs or {})

    def capture(self, fn: Callable[[list], Any]) -> Any:
        """Capture the next stage not captured yet with ``fn``, called as
        that stage was (with a one-element list holding the previous
        stage's captured outputs, which it should pop); returns its
        outputs (tensors that do not own their memory). Allocations are
        served from the plan the recording pass made: fn must allocate as
        the stage did then. The stages before it may have replayed since
        (a capture runs nothing). The capture errs only on this thread's
        unsafe CUDA calls (a backward's, while autograd's other threads
        run). A failed capture leaves the stage
        uncaptured for good (its inputs were handed to fn); the chain's
        captured stages still replay."""
        p = self._pending
        if self._graphs is None:
            raise ArenaplanError(f"arenaplan: capture in a closed chain (family {self._fid})")
        if p is None or p.handed is None:
            raise ArenaplanError(f"arenaplan: chain {self._fid}: no stage left to capture")
        t = time.perf_counter()
        workspaces(p.stream, self._device)  # this thread's (a backward runs in autograd's)
        i, handed = len(self._graphs), p.handed
        p.handed = None
        g = torch.cuda.CUDAGraph()
        sid = self._sids[i]
        try:
            out = _capture(self._lib, sid, lambda: fn(handed), p.stream, g,
                           lambda: self._lib.step_serve(sid, p.stream.cuda_stream, p.strict), mode="thread_local")
        except BaseException:
            g.reset()
            raise
        self._graphs[i], self.outputs[i] = g, _family._weak(out)
        if i + 1 < p.stages:
            p.handed = [out]
        del out
        torch.cuda.synchronize(self._device)
        self.capture_ms[i] = (time.perf_counter() - t) * 1e3
        return self.outputs[i]

    def replay(self, key, *, prepared: bool = False) -> Any:
        if self._graphs is not None and key not in self._graphs and isinstance(key, int) and \
                self._pending is not None and len(self._graphs) <= key < self._pending.stages:
            raise ArenaplanError(f"arenaplan: stage {key} of chain {self._fid} is not captured yet "
                                 "(GraphChain.capture)")
        return super().replay(key, prepared=prepared)

    def close(self) -> None:
        """Destroy the graphs and give the arena back (outputs handed to a
        stage not captured yet are dropped first: their memory is the
        arena's)."""
        if self._pending is not None:
            self._pending.handed = None
            self._pending = None
        super().close()


class _Pending:
    """What capturing a chain's later stages needs."""

    def __init__(self, stream: "torch.cuda.Stream", strict: bool, stages: int, handed: Optional[list]):
        self.stream, self.strict, self.stages, self.handed = stream, strict, stages, handed


def chain(stages: Sequence[Callable[[Optional[list]], Any]], *, warmup: int = 2, strict: bool = False,
          budget: float = 1.0, name: Optional[str] = None, device: Optional[int] = None,
          stream: Optional["torch.cuda.Stream"] = None, capture: Optional[int] = None) -> GraphChain:
    """Capture steps that run in turn into one planned arena. Stage 0 is
    called with None; stage i > 0 with a one-element list holding stage
    i-1's outputs, which it should pop, so that what it frees is freed
    inside it (a backward freeing the forward's saved activations as it
    goes). ``warmup`` passes over all stages, the last one recorded (each
    stage its own window of one timeline), on the current stream; one
    plan; one capture per stage, in order, on ``stream`` (default: a new
    one). ``capture``: how many of the first stages are captured now
    (default: all); :meth:`GraphChain.capture` captures the others, in
    order, after the stages before them have run (their capture reads
    addresses known only then)."""
    lib = _state.need()
    _state.check_budget(budget)
    if not stages:
        raise ArenaplanError("arenaplan.torch.chain: no stages")
    if warmup < 1:
        raise ValueError(f"arenaplan.torch.chain: warmup={warmup}: want >= 1 (the last pass is recorded)")
    ncap = len(stages) if capture is None else capture
    if not 1 <= ncap <= len(stages):
        raise ValueError(f"arenaplan.torch.chain: capture={capture}: want 1 to {len(stages)} (the stages)")
    dev = torch.cuda.current_device() if device is None else device
    stream = capture_stream(dev, stream)
    h = stream.cuda_stream
    cur = torch.cuda.current_stream(dev)

    def one_pass(sids: Optional[List[int]]) -> None:
        box: Optional[list] = None
        for i, fn in enumerate(stages):
            if sids is None:
                out = fn(box)
            else:
                lib.step_record(sids[i], cur.cuda_stream)
                with _run(lib, sids[i]):
                    out = fn(box)
            box = [out]
            del out
        del box

    fid = lib.chain_new(dev, name or "chain")
    gs: List["torch.cuda.CUDAGraph"] = []
    handed: List[Optional[list]] = [None]  # the box the next stage is called with
    try:
        sids = [lib.family_member(fid, str(i)) for i in range(len(stages))]
        # The eager passes run on the current stream, where the program's
        # own steps ran: they reuse the memory those left cached (a side
        # stream could not, and would map as much again).
        for _ in range(warmup - 1):
            one_pass(None)
        t0 = time.perf_counter()
        one_pass(sids)
        torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        # The plan gives the eager passes' cached memory back before it maps
        # the arena (the library does, for every step and family), so that
        # the two are never held at once.
        lib.family_plan(fid, budget)
        t2 = time.perf_counter()
        outs, cap_ms = [], []
        for i, fn in enumerate(stages[:ncap]):
            t = time.perf_counter()
            g = torch.cuda.CUDAGraph()
            sid = sids[i]
            out = _capture(lib, sid, lambda fn=fn: fn(handed[0]), stream, g,
                           lambda sid=sid: lib.step_serve(sid, h, strict))
            gs.append(g)
            outs.append(_family._weak(out))
            handed[0] = [out] if i + 1 < len(stages) else None
            del out
            torch.cuda.synchronize(dev)
            cap_ms.append((time.perf_counter() - t) * 1e3)
    except BaseException:
        handed[0] = None
        _family._abandon(lib, fid, gs)
        raise
    n = range(len(stages))
    ch = GraphChain(lib, fid, dict(zip(n, gs)), dict(zip(n, outs)), dict(zip(n, sids)), dict(zip(n, cap_ms)),
                    (t2 - t1) * 1e3, dev)
    if ncap < len(stages):
        ch._pending = _Pending(stream, strict, len(stages), handed[0])
    handed[0] = None
    ch.record_ms = {"all": (t1 - t0) * 1e3}  # one recording pass over every stage
    return ch
