"""A compiled graph run on arenaplan's graphs: one member per shape in one
family arena (inference, and the graphs of a training loop that have no
backward), shared by the graphs compiled from one frame of the program and,
where the order of calls allows it, by those of other frames that run one
after another on the same device (see :class:`_Group`)."""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from ._options import CompileOptions
from ._ops import _Ops
from ._shared import _Outputs, _Pair, _Warns, _fixed_outputs, _lock, _order, _runners, _unseen


class _Member:
    """One shape of a compiled graph: the inputs its capture reads.

    ``args`` holds the parameters, buffers and values read as they are, and
    None for each input copied (``copy_idxs``): that input's tensor is
    allocated inside the member's step, a buffer of the plan, and each
    replay copies the call's input to its planned address (``dst``).
    ``host`` keeps a host copy of the input the member was first captured
    with: the values its tensor takes in the runs before a later capture of
    the family (indices a graph gathers with must stay in range).

    Between captures the parameters and buffers are held by weak
    references (:meth:`let_go`): a member keeps no tensor of the program's
    alive (a static KV cache made anew for each ``generate`` call would
    otherwise stay, one per member). Its graph still reads their
    addresses; a call with tensors at those addresses replays it."""

    __slots__ = ("index", "args", "ptrs", "copy_idxs", "nbytes", "calls", "layouts", "host", "addrs", "dst",
                 "around", "moved", "replans", "static_layouts")

    def __init__(self, index: int, args: list, ptrs: list, copy_idxs: list, nbytes: int):
        self.index = index  # its key in the family (short, for the library)
        self.args, self.ptrs, self.copy_idxs, self.nbytes = args, ptrs, copy_idxs, nbytes
        self.calls = 0
        self.layouts: Dict[int, Any] = {}
        self.host: Dict[int, Any] = {}
        self.addrs: Dict[int, int] = {}  # from the member's last capture: the addresses replays use
        self.dst: List[Tuple[int, Any, int, int]] = []  # (input, tensor at its address, start, end)
        # Address ranges its plan leaves alone (memory the program held in
        # the arena when it joined, or that its replays kept moving out,
        # see _Group): its replays never write there.
        self.around: List[Tuple[int, int]] = []
        self.moved: List[Tuple[int, int]] = []  # the held ranges its last replay moved out
        self.static_layouts: Tuple[Hashable, ...] = ()  # its parameters' and buffers' shape keys (see _Runner._reuse)
        self.replans = 0  # plans of it made again around what its replays kept moving out (at most _REPLANS)

    def let_go(self, static: Sequence[int]) -> None:
        """Hold the tensors among args at indices static by weak references."""
        for i in static:
            x = self.args[i]
            if x is not None and type(x) is not weakref.ref:
                self.args[i] = weakref.ref(x)

    def gone(self) -> bool:
        """Whether one of args' tensors is gone (see :meth:`let_go`)."""
        return any(type(x) is weakref.ref and x() is None for x in self.args)

    def hold(self) -> bool:
        """Hold args' tensors again, for a capture; False (nothing changed)
        where one of them is gone."""
        strong = [x() if type(x) is weakref.ref else x for x in self.args]
        if any(x is None and type(w) is weakref.ref for x, w in zip(strong, self.args)):
            return False
        self.args[:] = strong
        return True


class _Group:
    """The graphs whose members share ONE family arena, planned jointly, as
    one graph's shapes are: those compiled from one frame of the program
    for one device (its recompilations: each size of a model compiled with
    ``dynamic=False``, a guard that failed) and those of other frames that
    joined them (below). They run one at a time, as one graph's shapes do:
    a replay first moves out what the program still holds of earlier
    replays' outputs where it may write them (see
    :meth:`_Outputs.overwritten`).

    Graphs of several frames (the two sides of a graph break, several
    compiled modules called in sequence) run one after another on one
    stream, so one arena serves them all: the largest need, plus what
    lives from one graph to the next, instead of the sum of their arenas.

    - Grouping, learned from the order of calls. The group whose graph
      replayed last on each device, and the thread that replayed it, are
      kept (``_last_on``). A graph of another frame whose frame has no
      group yet, at its first capture, joins that group when the last
      replay was on the same device and thread and both were compiled
      with ``share_frames`` and the same ops. Its frame's later graphs
      then join the same group. Otherwise it gets a group of its own, as
      before.
    - Values that cross from one graph to the next. Every member's plan
      starts at the arena's start, so members' buffers overlap by design.
      A member captured into a group of several frames, or whose call
      reads memory of an output of the family (``head(body(x))``: B
      takes A's output, which the caller holds while B runs), is planned
      around what the program holds in the arena then (:meth:`_held`:
      the held outputs of the members' replays, and the call's inputs in
      the family's output memory): each range is a fixed buffer live over
      its whole step (``GraphFamily.add(around=...)``, the bridge's
      ``PlanMemberAround``, checked by ``planner.Check``), so its scratch
      and outputs avoid them, it reads A's output where it lies (copied
      into its planned input, or read in place), and nothing has to move
      out; later plans of it (a capture that diverged) keep avoiding
      them. Where that needs more than the arena, the arena grows in
      place (``arena.Arena.Grow``: every address stays, the other
      members' graphs with it), so the arena is about the larger need
      plus the held bytes. A member's ranges are kept (``_Member.around``)
      and a replay of it leaves the held outputs inside them where they
      are. A group of one frame's shapes that reads nothing of its arena
      is planned as before: a member that does not fit captures the
      family anew, largest first.
    - Crossings met later: the loop. A member captured before the
      crossing it meets later (in a loop, A replays again while the
      program still holds B's output from the step before, its input
      ``x = head(body(x))`` or a value kept) was not planned around it:
      its replay moves that output out first (one copy), and the ranges
      moved are kept (``_Member.moved``). When its next replay would move
      out held outputs from the same ranges again, it is planned again
      around them, beside its own ``around``, with its own outputs fixed
      where they are, so that the plans of the others, which avoid them,
      stay valid (``GraphFamily.replan_around``, the bridge's
      ``ReplanMemberAround``, checked by ``planner.Check`` and
      ``planner.CheckFamily``; the arena grows in place where needed),
      and captured once more; its later replays move nothing there. So a
      loop pays one copy and one capture of A, not a copy per step. A
      held range on one of A's own outputs is never planned around (A
      writes it): it keeps moving out. Bounded: a member is planned again
      at most ``_REPLANS`` (2) times in its life, so a program whose
      order keeps changing does not capture every step; past that, its
      replays move out what they must, as before. A family captured anew
      (a member over ``max_shapes``, an ``add`` that failed) is planned
      jointly without the crossings: its held outputs move out again at
      each replay that may write them, and the loop is learned again.
    - The order changes, or a graph joins later. Correctness never rests
      on the order learned: each replay moves out the held outputs of
      the group's earlier replays (``_Group.inside``, whichever graph
      made them) but those its plan leaves alone, and runs without a
      graph while a view of one that would move is held (``_VIEW_HELD``);
      a new graph that does not fit captures the family anew, moving held
      outputs out first. What a changed order costs is copies, counted in
      the report's ``outputs_moved_out``, and at most ``_REPLANS``
      captures of a member planned again (above); a group that keeps
      paying copies past that is not split, which is not done.
    - Threads. Members of one family must not run concurrently;
      :meth:`GraphFamily.prepare` orders a replay after the previous one
      on another stream, and a graph joins only a group last replayed by
      its own thread. Two frames driven from two threads after they
      joined are ordered on the device, but the moves of held outputs
      are not locked between threads (as for one graph's shapes today).
    """

    def __init__(self) -> None:
        self.runners: List["weakref.ref[_Runner]"] = []
        self.family = None  # the GraphFamily, once captured
        self.next_index = 0  # the next member's key in the family
        self.inside: List[_Outputs] = []  # outputs of replays that the program may still hold in the arena
        self.builds = 0  # captures of the family anew
        self.moved = 0  # held outputs moved out of the arena before a replay
        self.ref = weakref.ref(self)  # what _last_on keeps (made once: set at every replay)

    def live(self) -> List["_Runner"]:
        """The graphs of the group still alive, first joined first."""
        rs = [w() for w in self.runners]
        rs = [r for r in rs if r is not None]
        self.runners = [weakref.ref(r) for r in rs]
        return rs


# Plans of a member made again around held outputs its replays kept moving
# out (see _Group): a program whose order keeps changing stops there.
_REPLANS = 2

_VIEW_HELD = ("a view of an output of an earlier call (at another shape, or of a graph sharing the arena) is still "
              "held; calls that would overwrite it run without a graph until it is released")

# The groups by (frame, device); a group lives while one of its graphs does.
_groups: "weakref.WeakValueDictionary[Hashable, _Group]" = weakref.WeakValueDictionary()
# Per device: the group whose graph replayed last, and the thread that replayed it.
_last_on: Dict[Optional[int], Tuple["weakref.ref[_Group]", int]] = {}


def _group_of(frame: Optional[Hashable], device: Optional[int], after: Optional[_Group] = None) -> _Group:
    """The group of the graphs compiled from frame for device; where the
    frame has none yet, ``after`` (the group a graph of another frame may
    join, see :meth:`_Runner._after`) or a new one (a group of its own,
    not kept by frame, where the frame is not known)."""
    if frame is None:
        return after if after is not None else _Group()
    key = (frame, device)
    with _lock:
        g = _groups.get(key)
        if g is None:
            g = _groups[key] = after if after is not None else _Group()
    return g


def _spans(ops: _Ops, outs: Iterable[Any]) -> List[Tuple[int, int]]:
    """The address ranges of the tensors among outs that have memory."""
    return [ops.extent(o) for o in outs if ops.is_tensor(o) and ops.nbytes(o)]


def _family_spans(ops: _Ops, g: _Group) -> List[Tuple[int, int]]:
    """The address ranges of every output of g's family (a replay of its
    member may write there); none before the family is captured."""
    if g.family is None:
        return []
    return [r for outs in g.family.outputs.values() for r in _spans(ops, outs)]


def _in_outputs(ops: _Ops, g: _Group, xs: Sequence[Any]) -> bool:
    """Whether a tensor among xs lies in the memory of an output of g's
    family (a replay of any member may write there)."""
    spans = _family_spans(ops, g)
    if not spans:
        return False
    for x in xs:
        if ops.is_tensor(x):
            a, b = ops.extent(x)
            if any(a < hi and lo < b for lo, hi in spans):
                return True
    return False


_IN_ARENA = ("a parameter or buffer lies in the memory of an output of a graph sharing the arena (the capture "
             "would read it in place where the replays write); calls with it run without a graph")


class _Runner(_Warns):
    """A compiled graph (inductor's boxed callable) run on arenaplan's graphs.

    Called with a list of inputs, which it empties (AOTAutograd's boxed
    convention, so that inputs can be freed early).
    """

    def __init__(self, inner: Callable[[list], Any], name: str, static_idxs: Sequence[int],
                 reason: Optional[str], opts: CompileOptions, ops: _Ops, device: Optional[int] = None,
                 mutated: Sequence[int] = (), frame: Optional[Hashable] = None):
        # An attribute of the instance, not of the class: wrappers made with
        # functools.wraps (dynamo's disable() around AOTAutograd's backward)
        # copy the instance's, and AOTAutograd then hands the wrapper its
        # list. Called unpacked instead, every saved activation stays held
        # by the caller's arguments until the whole backward returns (on
        # ResNet-18 training, about 100 MiB more at the first backward).
        self._boxed_call = True
        self.inner, self.name, self.opts, self.ops = inner, name, opts, ops
        self.frame = frame  # the program's frame it was compiled from (dynamo's frame id), if known
        self.group: Optional[_Group] = None  # its family's group, from its first capture
        self.static = sorted(set(static_idxs))
        self.mutated = sorted(set(mutated))  # inputs the graph writes in place (parameters and buffers only)
        self.reason = reason  # why this graph never captures; None while it may
        self.members: Dict[Hashable, _Member] = {}
        self.by_shape: Dict[Hashable, Hashable] = {}  # shape key -> the member key used last
        self.seen: Dict[Hashable, int] = {}  # plain calls made per shape key
        self.device: Optional[int] = device
        self.dyn: Optional[List[int]] = None  # indices of the inputs that are not parameters or buffers
        self.in_place: List[int] = []  # among dyn, those read in place as static ones are (_adopt_fixed)
        self.captures = 0  # members captured, re-captures included
        self.plain_calls = 0  # calls that ran inductor's code without a graph
        self.replays = 0
        self.warned: set = set()
        self._outs: Dict[Hashable, _Outputs] = {}  # per member: its outputs
        self.input_bytes = 0  # the copied inputs' bytes, every member's, planned in the arena
        self.pair: Optional[_Pair] = None  # a training graph's forward and backward
        with _lock:
            _order[0] += 1
            self.order = _order[0]
        _runners.add(self)
        if reason is not None:
            self._warn(reason, reason)

    @property
    def family(self):
        """The GraphFamily the graph's members are in (its group's), or None."""
        return self.group.family if self.group is not None else None

    # The call.
    def __call__(self, *args) -> Any:
        # Boxed (one list, emptied so that inputs can be freed early), or
        # unpacked where a caller does not look for _boxed_call.
        if len(args) == 1 and type(args[0]) is list:
            inputs = list(args[0])
            args[0].clear()
        else:
            inputs = list(args)
        if self.pair is not None:
            return self.pair.call(self, inputs)
        if self.reason is not None:
            return self._plain(inputs)
        shape = self._shape_key(inputs)
        if shape is None:
            return self._plain(inputs)
        key = self.by_shape.get(shape)
        m = self.members.get(key) if key is not None else None
        if m is not None and self.static and not self.ops.ptrs_equal(inputs, m.ptrs, self.static):
            m = None  # parameters or buffers elsewhere: another member
        if m is None:
            key = (shape, tuple(self.ops.data_ptr(inputs[i]) for i in self.static))
            m = self.members.get(key)
            if m is None:
                n = self.seen.get(shape, 0)
                if n < self.opts.warmup:
                    self.seen[shape] = n + 1
                    return self._warm(inputs)
                if not self.members and self._adopt_fixed(inputs):
                    key = (shape, tuple(self.ops.data_ptr(inputs[i]) for i in self.static))
                m = self._reuse(shape, key, inputs) or self._add(key, inputs)
                if m is None:
                    return self._plain(inputs)
            self.by_shape[shape] = key
        return self._replay(m, inputs)

    def _replay(self, m: _Member, inputs: list) -> Any:
        g = self.group
        if m.moved and m.replans < _REPLANS and not self._settle(m, inputs):
            return self._plain(inputs)
        fam = g.family
        fam.prepare()  # the previous replay may still use the memory written here; a paused arena has none
        outs = self._outs[m.index]
        moved: List[Tuple[int, int]] = []
        for o in g.inside:
            if o is outs:
                continue
            # Another member's outputs: the copies in and the replay may
            # write their memory, so those held move out first (an input
            # among them is then copied in from where it went), but for
            # those in memory this member's plan leaves alone (m.around);
            # one that cannot move (a view of it is held) keeps its memory:
            # this call runs without a graph.
            before = o.moved
            ok = o.overwritten(m.around, moved)
            g.moved += o.moved - before
            if not ok:
                self._warn("view", _VIEW_HELD)
                return self._plain(inputs)
        m.moved = moved
        if m.dst:
            self._copy_in(m, inputs)
        del inputs
        fam.replay(m.index, prepared=True)
        m.calls += 1
        self.replays += 1
        g.inside = [o for o in g.inside if o is not outs and o.held()]
        g.inside.append(outs)
        _last_on[self.device] = (g.ref, threading.get_ident())
        return outs.take()

    def _settle(self, m: _Member, inputs: list) -> bool:
        """Before a replay of member m whose last replay moved out held
        outputs of other members: where some would move out again, from
        the same addresses (the program keeps them across m's replays, a
        loop), plan m again around them too, its outputs where they were,
        and capture it once more (see :class:`_Group`); a synchronize, a
        plan and a capture, at most ``_REPLANS`` times per member. False
        where m is gone (its capture failed and the family could not be
        captured anew): the call runs without a graph."""
        g, ops = self.group, self.ops
        outs = self._outs[m.index]
        moving = {r for o in g.inside if o is not outs for r in o.exposed(m.around)}
        again = sorted(r for r in m.moved if r in moving)
        # A held range on one of m's own outputs cannot be left alone: m
        # writes its outputs where they are. It keeps moving out.
        mine = _spans(ops, g.family.outputs[m.index])
        again = [(lo, hi) for lo, hi in again if not any(a < hi and lo < b for a, b in mine)]
        if not again:
            return True
        m.replans += 1  # a refused plan or a parameter gone counts too: no retry at every call
        if not m.hold():
            return True
        around = sorted(set(m.around) | set(again))
        fam = g.family
        old = fam.outputs[m.index]
        m.addrs.clear()
        try:
            with _unseen(ops, self.device, self.written(inputs)):
                ops.replan_member(fam, m.index, self._step(m, m.host), around, self.device, self.opts)
            m.around, m.moved = around, []
        except Exception:  # noqa: BLE001 - refused (captured again as it was), or its capture failed
            if m.index not in fam.keys:
                return self._rebuilt(m)
        finally:
            m.let_go(self.static)
        return self._captured_again(m, old)

    def _captured_again(self, m: _Member, old: Sequence[Any]) -> bool:
        """After member m was captured once more (planned again, or on its
        plan with other parameters): its input addresses and outputs taken
        from the new capture (old: the outputs of the one before). False
        where it lost its graph and the family could not be captured anew."""
        g, ops, fam = self.group, self.ops, self.group.family
        outs = self._outs[m.index]
        if any(i not in m.addrs for i in m.copy_idxs):
            return self._rebuilt(m)
        self.captures += 1
        m.dst = self._dst(m)
        new = fam.outputs[m.index]
        if not self._same_outputs(old, new):
            # Its outputs moved after all (its capture diverged and was
            # planned again): those held go to memory of their own, as
            # before a capture anew.
            if not outs.overwritten():
                outs.release()
            g.inside = [o for o in g.inside if o is not outs]
            self._outs[m.index] = _Outputs(ops, new)
        return True

    def _reuse(self, shape: Hashable, key: Hashable, inputs: list) -> Optional[_Member]:
        """A member of the call's shape whose parameters or buffers are all
        of the call's shapes but gone (a static KV cache that each
        ``generate`` call makes anew), captured once more on its plan with
        the call's instead of a new member: one capture, no eager run, no
        planning (:meth:`GraphFamily.recapture`). None where there is none
        (or its capture failed: the family was captured anew without it)."""
        fam, ops = self.family, self.ops
        if fam is None or not self.static:
            return None
        layouts = tuple(ops.shape_key(inputs[i]) for i in self.static)
        old_key = next((k for k, m in self.members.items()
                        if k[0] == shape and m.static_layouts == layouts and m.gone()), None)
        if old_key is None or _in_outputs(ops, self.group, [inputs[i] for i in self.static]):
            return None
        m = self.members.pop(old_key)
        for i in self.static:
            m.args[i], m.ptrs[i] = inputs[i], ops.data_ptr(inputs[i])
        self.members[key] = m
        old = fam.outputs[m.index]
        m.addrs.clear()
        try:
            with _unseen(ops, self.device, self.written(inputs)):
                ops.recapture_member(fam, m.index, self._step(m, m.host), self.device, self.opts)
        except Exception:  # noqa: BLE001 - its capture failed: it left the family
            return m if self._rebuilt(m) else None
        finally:
            m.let_go(self.static)
        return m if self._captured_again(m, old) else None

    def _same_outputs(self, old: Sequence[Any], new: Sequence[Any]) -> bool:
        """Whether a capture's outputs new lie where the last capture's, old,
        did, alike: then the member's _Outputs stays, and what the program
        holds of it is as after any replay."""
        ops = self.ops
        if len(old) != len(new):
            return False
        for a, b in zip(old, new):
            if ops.is_tensor(a) != ops.is_tensor(b):
                return False
            if ops.is_tensor(a) and (ops.data_ptr(a), ops.shape_key(a)) != (ops.data_ptr(b), ops.shape_key(b)):
                return False
        return True

    def _rebuilt(self, m: _Member) -> bool:
        """Member m lost its graph: capture the family anew; where that
        fails, m is dropped (its shape is captured again at a later call)."""
        if self._build() and m in self.members.values():
            return True
        self.members = {k: v for k, v in self.members.items() if v is not m}
        self.by_shape = {s: k for s, k in self.by_shape.items() if k in self.members}
        return False

    def _copy_in(self, m: _Member, inputs: list) -> None:
        """Copy the call's inputs to their planned addresses. An input
        already there (the previous call's output at that address, fed
        back) is not copied; one whose memory a copy writes (an earlier
        output elsewhere in the arena) is first cloned outside it, since
        the copies would overwrite it before it is read."""
        ops = self.ops
        todo = [(d, inputs[i], lo, hi) for i, d, lo, hi in m.dst if ops.data_ptr(inputs[i]) != lo]
        for k, (d, src, lo, hi) in enumerate(todo):
            a, b = ops.extent(src)
            if any(a < h and l < b for _, _, l, h in todo):
                tmp = ops.empty(ops.layout(src))
                ops.copy(tmp, src)
                todo[k] = (d, tmp, lo, hi)
        ops.copy_all([d for d, _, _, _ in todo], [src for _, src, _, _ in todo])

    def _plain(self, inputs: list) -> Any:
        self.plain_calls += 1
        return self.inner(inputs)

    def _warm(self, inputs: list) -> Any:
        """A warm-up call (one before its shape's capture): a plain call on
        the capture stream (see _Ops.on_capture_stream), as CUDAGraph Trees
        warm up, so that a process holds one set of math-library
        workspaces, the captures', as it would hold one without graphs."""
        if self.device is None:
            return self._plain(inputs)
        with self.ops.on_capture_stream(self.device):
            out = self._plain(inputs)
        self.ops.used_here(out, self.device)
        return out

    # Shapes and members.
    def _shape_key(self, inputs: list) -> Optional[Hashable]:
        """The key of a call's shape: the shape, strides, dtype and offset of
        every input that is not a parameter or buffer, every other input's
        value (parameters and buffers are checked by address instead); None
        (and the graph given up) where the inputs cannot be captured."""
        dyn = self.dyn
        ops, key = self.ops, []
        if dyn is None:
            static = set(self.static)
            self.static = [i for i in range(len(inputs)) if i in static and ops.is_tensor(inputs[i])]
            dyn = self.dyn = [i for i in range(len(inputs)) if i not in self.static]
        for i in dyn:
            x = inputs[i]
            if ops.is_tensor(x):
                d = ops.device(x)
                if d[0] != "cuda":
                    self._give_up(f"an input is on the {d[0]} device")
                    return None
                if self.device is None:
                    self.device = d[1]
                elif d[1] != self.device:
                    self._give_up(f"inputs on several devices (cuda:{self.device}, cuda:{d[1]})")
                    return None
                key.append(ops.shape_key(x))
            else:
                key.append(x if isinstance(x, (int, float, bool, str, type(None))) else repr(x))
        return tuple(key)

    def _add(self, key: Hashable, inputs: list) -> Optional[_Member]:
        if len(self.members) >= self.opts.max_shapes and not any(m.gone() for m in self.members.values()):
            self._warn("limit", f"more than max_shapes={self.opts.max_shapes} shapes (or parameter addresses); "
                                "this one and later new ones run without a graph")
            return None
        ops, static = self.ops, set(self.static)
        if not ops.can_make_outputs():
            self._give_up("this torch cannot make tensors at a graph's addresses "
                          "(torch._C._construct_storage_from_data_pointer, Tensor._use_count)")
            return None
        if self.group is None:
            self.group = _group_of(self.frame, self.device, self._after())
            self.group.runners.append(weakref.ref(self))
        if _in_outputs(ops, self.group, [inputs[i] for i in self.static]):
            self._warn("in arena", _IN_ARENA)
            return None
        args, ptrs, copy_idxs, nbytes = [], [None] * len(inputs), [], 0
        m = _Member(self.group.next_index, args, ptrs, copy_idxs, 0)
        for i, x in enumerate(inputs):
            if i in static and ops.is_tensor(x):
                args.append(x)
                ptrs[i] = ops.data_ptr(x)
            elif ops.is_tensor(x):
                args.append(None)  # allocated inside the step: see _step
                copy_idxs.append(i)
                m.layouts[i] = ops.layout(x)
                m.host[i] = ops.host(x)
                nbytes += ops.nbytes(x)
            else:
                args.append(x)
        m.nbytes = nbytes
        m.static_layouts = tuple(ops.shape_key(inputs[i]) for i in self.static)
        around = self._held(inputs) if self._crosses(inputs) else []
        self.group.next_index += 1
        self.members[key] = m
        with _unseen(ops, self.device, self.written(inputs)):
            if not self._grow(m, {i: inputs[i] for i in copy_idxs}, around):
                return None
        self.input_bytes += nbytes
        return m

    def _adopt_fixed(self, inputs: list) -> bool:
        """At the graph's first capture: its inputs that are outputs of a
        captured training graph (the gradients a compiled optimizer step
        takes from a chain's backward) are read in place from then on, as
        CUDAGraph Trees read a parent graph's outputs, rather than planned
        in this graph's arena and copied there at every call. Such an input
        is then checked by address as parameters are (a call with it
        elsewhere replays another member) and keeps its shape in the
        shape key. True where the graph took one."""
        ops = self.ops
        with _lock:
            fixed = set(_fixed_outputs)
        if not fixed:
            return False
        static = set(self.static)
        take = [i for i in (self.dyn or ()) if i not in static and ops.is_tensor(inputs[i])
                and ops.nbytes(inputs[i]) and ops.data_ptr(inputs[i]) in fixed]
        if not take:
            return False
        self.in_place = sorted(take)
        self.static = sorted(static | set(take))
        return True

    def _after(self) -> Optional[_Group]:
        """The group of the graph replayed last on this graph's device, where
        this graph may join it (see :class:`_Group`): same thread, both
        sharing frames over the same ops. None: a group of its own."""
        if not self.opts.share_frames:
            return None
        last = _last_on.get(self.device)
        g = last[0]() if last is not None else None
        if g is None or last[1] != threading.get_ident() or g.family is None or not g.inside:
            return None
        rs = g.live()
        if not rs or any(r.ops is not self.ops or not r.opts.share_frames for r in rs):
            return None
        return g

    def _crosses(self, inputs: list) -> bool:
        """Whether values may cross into this call from another graph of
        its group: the group has graphs of other frames, or the call reads
        the memory of an output of its family. Then the call's member is
        planned around what the program holds (:meth:`_held`); a group of
        one frame's shapes that reads nothing of its arena is planned as
        one graph's shapes are, jointly, largest first."""
        g = self.group
        if g is None or g.family is None:
            return False
        return any(r.frame != self.frame for r in g.live()) or _in_outputs(self.ops, g, inputs)

    def _held(self, inputs: list) -> List[Tuple[int, int]]:
        """The memory of the group's family arena that the program holds
        while this call runs, as address ranges: the outputs of its
        members' replays that something holds, and this call's inputs that
        lie in the memory of an output of the family (it reads them)."""
        g, ops = self.group, self.ops
        if g is None or g.family is None:
            return []
        spans = [ops.extent(o.current(i)) for o in g.inside for i in o.held()]
        outs = _family_spans(ops, g)
        for x in inputs:
            if ops.is_tensor(x) and ops.nbytes(x):
                a, b = ops.extent(x)
                if any(a < hi and lo < b for lo, hi in outs):
                    spans.append((a, b))
        return sorted(set(spans))

    def written(self, inputs: list) -> List[Any]:
        """The call's inputs that the graph writes in place."""
        return [inputs[i] for i in self.mutated if i < len(inputs) and self.ops.is_tensor(inputs[i])]

    def _grow(self, new: _Member, new_inputs: Dict[int, Any], around: Sequence[Tuple[int, int]] = ()) -> bool:
        """Capture member new into the family's arena as it is (the others
        keep their graphs, and the last call's outputs stay valid): when it
        fits, which a smaller shape after a larger one does, or, planned
        ``around`` the memory the program holds in the arena (see
        :meth:`_held`), with the arena grown in place where it needs more;
        else, or with no family yet, capture every member again
        (:meth:`_build`)."""
        fam, ops = self.family, self.ops
        if fam is None or len(self.members) > self.opts.max_shapes:
            # No family yet, or one member too many: the members whose
            # buffers are gone make room (see _add), by a capture of the
            # family anew without them.
            return self._build(new, new_inputs)
        new.addrs.clear()
        try:
            ops.add_member(fam, new.index, self._step(new, new_inputs), self.device, self.opts, around=around)
        except Exception:  # noqa: BLE001 - it does not fit, or its capture failed: capture every member again
            return self._build(new, new_inputs)
        if any(i not in new.addrs for i in new.copy_idxs):
            return self._build(new, new_inputs)
        self.captures += 1
        self._outs[new.index] = _Outputs(ops, fam.outputs[new.index])
        new.dst = self._dst(new)
        new.around = list(around)
        new.let_go(self.static)
        return True

    def _dst(self, m: _Member) -> List[Tuple[int, Any, int, int]]:
        """Where each copied input of member m goes: (input, a tensor at its
        planned address, start, end)."""
        dst = []
        for i in m.copy_idxs:
            nbytes = self.ops.nbytes(m.host[i])  # the bytes its tensor spans
            if nbytes:
                p = m.addrs[i]
                dst.append((i, self.ops.at(p, m.layouts[i]), p, p + nbytes))
        return dst

    def _build(self, new: Optional[_Member] = None, new_inputs: Optional[Dict[int, Any]] = None) -> bool:
        """(Re)capture every member of the group's graphs into one family
        arena, the largest (most input bytes) first; on failure give this
        graph up (the others capture again at their next call). The runs
        before each capture take the copied inputs' values from new_inputs
        for the member new, from the host copies for the others."""
        ops, g = self.ops, self.group
        runners = g.live()
        # The outputs the program holds move out before the family's memory
        # goes; while a view of one is held, nothing is captured anew (the
        # call runs without a graph, the next one at its shape tries again).
        for r in runners:
            if not all([o.overwritten() for o in r._outs.values()]):
                if new is not None:
                    self.members = {k: v for k, v in self.members.items() if v is not new}
                self._warn("view", _VIEW_HELD)
                return False
        for r in runners:
            r._release_outputs()
        if g.family is not None:
            g.family.close()
            g.family = None
        # A member whose parameters or buffers are gone cannot be captured
        # again: dropped (a call with its shape is captured anew).
        owned: List[Tuple[_Member, _Runner]] = []
        for r in runners:
            for k in [k for k, m in r.members.items() if not m.hold()]:
                del r.members[k]
            owned += [(m, r) for m in r.members.values()]
        owned.sort(key=lambda mr: -mr[0].nbytes)
        fns = {}
        written: Dict[int, Any] = {}  # what the other members' runs write in place, by identity
        for m, r in owned:
            m.addrs.clear()
            m.around, m.moved = [], []  # planned jointly: every member's plan starts at the arena's start
            fns[m.index] = r._step(m, new_inputs if m is new and new_inputs else m.host)
            if m is not new:
                written.update((id(x), x) for x in r.written(m.args))
        try:
            # The runs of the other members (the call's own are undone by
            # the caller) leave what they write as it was (see _unseen).
            with _unseen(ops, self.device, list(written.values())):
                fam = ops.capture(fns, f"{self.name}", self.device, self.opts)
        except Exception as e:  # noqa: BLE001 - any failure means: run without a graph
            self._unbuilt(runners)
            self._give_up(f"capture failed: {type(e).__name__}: {e}")
            return False
        if any(i not in m.addrs for m, _ in owned for i in m.copy_idxs):
            fam.close()
            self._unbuilt(runners)
            self._give_up("capture failed: a copied input was not allocated in its member's capture")
            return False
        g.family = fam
        g.builds += 1
        for m, r in owned:
            r.captures += 1
            r._outs[m.index] = _Outputs(ops, fam.outputs[m.index])
            m.dst = r._dst(m)
            m.let_go(r.static)
        return True

    @staticmethod
    def _unbuilt(runners: Sequence["_Runner"]) -> None:
        """A family capture failed: no graph of the group keeps a member
        (each captures again at its next call, the one given up not)."""
        for r in runners:
            r.members.clear()
            r.by_shape.clear()

    def _step(self, m: _Member, src: Dict[int, Any]) -> Callable[[], Any]:
        """Member m's step, as captured: each copied input is allocated at
        the step's start (so that the plan places it in the arena, live
        until inductor's code frees it after its last use: nothing else may
        hold it), filled from src in the runs before the capture (not in
        the capture: that would be a graph node reading src), and its
        address kept from the capture (the last capture's is the one
        replays use)."""
        ops, inner, args, layouts = self.ops, self.inner, m.args, m.layouts

        def step():
            a = list(args)
            capturing = ops.capturing()
            for i in m.copy_idxs:
                p = ops.empty(layouts[i])
                if capturing:
                    m.addrs[i] = ops.data_ptr(p)
                else:
                    ops.fill(p, src[i])
                a[i] = p
                p = None
            return inner(a)
        return step

    # Reports.
    def report(self) -> Dict[str, Any]:
        """The graph's counts; where its arena is shared with the other
        graphs of its frame (``shares_arena_with``), the arena's figures are
        the first graph's, and the others report no graph bytes, so that a
        sum over graphs counts the arena once."""
        if self.pair is not None:
            return self.pair.report(self)
        g = self.group
        captured = self.family is not None and bool(self.members)
        r: Dict[str, Any] = {"graph": self.name, "captured": captured, "reason": self.reason,
                             "members": len(self.members), "captures": self.captures,
                             "family_builds": g.builds if g is not None else 0, "replays": self.replays,
                             "outputs_moved_out": g.moved if g is not None else 0,
                             "plain_calls": self.plain_calls, "input_bytes_planned": self.input_bytes,
                             "input_bytes_outside": 0,
                             "static_inputs": len(self.static) - len(self.in_place),
                             "other_inputs": len(self.dyn or ()), "inputs_in_place": len(self.in_place),
                             "from_mode": self.opts.from_mode}
        if captured:
            f = self.family.report()
            for k in ("arena", "lower_bound", "ratio", "arena_mapped", "spill_held", "graph_bytes", "plan_build_ms"):
                if k in f:
                    r[k] = f[k]
            r["capture_ms"] = sum(f.get("capture_ms", {}).values())
            first = next((o for o in g.live() if o.members), self)
            if first is not self:
                r["shares_arena_with"] = first.name
                r["graph_bytes"] = 0
        return r

    def close(self) -> None:
        """Drop the graph's captures, and those of the graphs that share its
        arena (they capture again at their next call); outputs still held
        become unreadable."""
        if self.pair is not None:
            self.pair.close()
        g = self.group
        for r in g.live() if g is not None else [self]:
            r._release_outputs()
            r.members.clear()
            r.by_shape.clear()
        if g is not None:
            if g.family is not None:
                g.family.close()
                g.family = None
            g.inside = []
        self.members.clear()

    def _release_outputs(self) -> None:
        """Forget every member's outputs (the graphs that wrote them are
        going): those still held are made unreadable."""
        for o in self._outs.values():
            o.release()
        self._outs.clear()
        if self.group is not None:
            self.group.inside = []
