"""A training graph: AOTAutograd's forward and backward captured as one chain."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from ._options import CompileOptions
from ._ops import _Ops
from ._shared import _Outputs, _Warns, _fixed_outputs, _lock, _unseen, _warm_pool

if TYPE_CHECKING:
    from ._infer import _Runner

class _TrainMember:
    """One shape of a training graph: its forward and backward captured as
    one chain, and what its replays left live."""

    def __init__(self, shape: Hashable):
        self.shape = shape
        self.chain = None
        self.fw_args: list = []
        self.fw_ptrs: list = []
        self.fw_check: List[int] = []  # forward inputs read in place: parameters, other graphs' outputs
        self.fw_inplace: set = set()
        self.bw_ptrs: list = []
        self.bw_static: List[int] = []
        self.tangents: Dict[int, Any] = {}  # incoming gradients' placeholders, by backward input
        self.tangent_inplace: Dict[int, int] = {}  # ... and those read in place: the address the capture read
        self.tangent_layouts: Dict[int, Hashable] = {}
        self.tangent_keys: Dict[int, Hashable] = {}
        self.tan: Dict[int, Any] = {}  # what the backward stage gets as its incoming gradients
        self.bw_stage: Optional[Callable[[list], Any]] = None
        self.saved_cuda: List[int] = []
        self.rep: Optional[int] = None  # the forward output whose storage stands for every saved activation
        self.user_idx: List[int] = []  # the forward's tensor outputs that are the program's (not saved)
        self.fw_out: Optional[_Outputs] = None
        self.bw_out: Optional[_Outputs] = None
        self.gen = self.bw_gen = 0
        self.saved_id: Optional[int] = None  # the storage of the last forward replay's saved activation (rep)
        self.grad_ptrs: set = set()  # the addresses of the backward's outputs' memory
        self.placeholder_bytes = 0


class _TrainPair(_Warns):
    """A training graph: AOTAutograd's forward and its backward, captured
    as ONE chain (:func:`arenaplan.torch.chain`): one arena planned on one
    timeline, the activations the forward saves read in place by the
    backward and their memory reused once it frees them.

    A shape is captured after one plain forward and backward at that shape
    (which show which backward inputs are the forward's outputs and which
    are incoming gradients, and the gradients' shapes); up to
    ``max_shapes`` shapes (the last, partial batch of an epoch is one), each
    its own chain and arena (one family arena would be re-captured at each
    new shape, moving the outputs that other captured graphs read in place:
    a loss graph reads the model graph's logits). A call that cannot replay
    safely runs inductor's code without a graph, with one warning naming
    the reason: a forward while the same shape's previous forward's saved
    activations still wait for their backward (its replay would overwrite
    them), a call while a gradient of the previous backward is still held
    where it cannot be moved out of the arena (see :meth:`_release_grads`),
    other parameter addresses, more shapes than ``max_shapes``. A backward whose saved activations a later
    forward replay overwrote (``retain_graph=True``, then another forward)
    raises.
    """

    def __init__(self, name: str, opts: CompileOptions, ops: _Ops):
        self.name, self.opts, self.ops = name, opts, ops
        self.fw: Optional[_Runner] = None
        self.bw: Optional[_Runner] = None
        self.reason: Optional[str] = None
        self.fw_out_meta: Optional[List[Any]] = None  # the last plain forward's outputs
        self.fw_in_meta: Optional[List[Any]] = None  # ... and inputs
        self.plain_shape: Optional[Hashable] = None  # ... and its shape
        self.bw_map: Optional[List[Tuple[str, Any]]] = None  # per backward input: where it comes from
        self.saved_idxs: List[int] = []
        self.saved_set: set = set()
        self.learned: Dict[Hashable, Dict[int, Any]] = {}  # per shape: incoming gradients' (layout, shape key)
        self.learned_vals: Dict[Hashable, Dict[int, Any]] = {}  # ... and its backward's other inputs (sizes)
        self.members: Dict[Hashable, _TrainMember] = {}
        self.warned: set = set()
        self.replays = {"forward": 0, "backward": 0}
        self.plain = {"forward": 0, "backward": 0}
        self.grads_moved = 0  # times held gradients were moved out of the arena before a replay

    # Calls.
    def call(self, r: _Runner, inputs: list) -> Any:
        if r is self.fw:
            return self.forward(inputs)
        return self.backward(inputs)

    def forward(self, inputs: list) -> Any:
        fw, bw, ops = self.fw, self.bw, self.ops
        if self.reason is None and bw is not None and bw.reason is not None:
            self._give_up(f"its backward cannot be captured ({bw.reason})")
        if self.reason is not None:
            return self._plain_fw(inputs, None)
        shape = fw._shape_key(inputs)
        if shape is None:
            self.reason = fw.reason  # fw warned
            return self._plain_fw(inputs, None)
        m = self.members.get(shape)
        if m is None:
            if shape not in self.learned:
                return self._plain_fw(inputs, shape)  # its backward shows what to capture
            if len(self.members) >= self.opts.max_shapes:
                self._warn("limit", f"more than max_shapes={self.opts.max_shapes} shapes; calls with later new "
                                    "ones run without a graph")
                return self._plain_fw(inputs, shape)
            with _unseen(ops, fw.device, fw.written(inputs)):
                m = self._build(inputs, shape)
            if m is None:
                return self._plain_fw(inputs, shape)
        elif m.fw_check and not ops.ptrs_equal(inputs, m.fw_ptrs, m.fw_check):
            self._warn("params", "a training graph is captured for one set of parameter addresses; calls with "
                                 "others run without a graph")
            return self._plain_fw(inputs, None)
        if m.gen > m.bw_gen and m.rep is not None and m.rep in m.fw_out.held():
            self._warn("pending", "a forward ran while the previous forward's saved activations still wait for "
                                  "their backward; such forwards (and their backwards) run without a graph")
            return self._plain_fw(inputs, None)
        if not self._release_grads(m):
            return self._plain_fw(inputs, None)
        moves = [(m.fw_args[i], inputs[i]) for i in fw.dyn or () if i not in m.fw_inplace
                 and ops.is_tensor(inputs[i]) and ops.data_ptr(m.fw_args[i]) != ops.data_ptr(inputs[i])]
        ops.copy_all([d for d, _ in moves], [s for _, s in moves])
        del inputs, moves
        m.chain.replay(0)
        # The program's outputs still held are overwritten: they raise when
        # read. Saved activations still held (by a graph kept with
        # retain_graph=True) are not: their backward raises (see backward).
        fresh = m.fw_out.take(m.user_idx)
        m.gen += 1
        self.replays["forward"] += 1
        # One saved activation stands for all of them: the call's autograd
        # node holds them together and frees them together.
        if m.rep is not None:
            m.saved_id = ops.storage_id(fresh[m.rep])
        return fresh

    def backward(self, inputs: list) -> Any:
        ops = self.ops
        if self.reason is not None:
            return self._plain_bw(inputs)
        m = next((m for m in self.members.values() if self._takes(m, inputs)), None)
        if m is None:
            # A plain forward's backward: learn from it.
            if self.plain_shape is not None and self.plain_shape not in self.learned:
                self._learn(inputs, self.plain_shape)
                return self._plain_bw(inputs, warm=True)
            return self._plain_bw(inputs)
        for i in m.saved_cuda[:1]:  # the one that stands for all (see forward)
            if ops.storage_id(inputs[i]) != m.saved_id:
                raise RuntimeError(f"arenaplan.compile: {self.name}: this backward's saved activations were "
                                   "overwritten by a later replay of its forward (retain_graph=True, then another "
                                   "forward): run the backward before the next forward")
        m.bw_gen = m.gen
        if not self._release_grads(m):
            return self._plain_bw(inputs)
        if m.bw_out is None and not self._capture_bw(m, inputs):
            return self._plain_bw(inputs)
        for i, p in m.tangent_inplace.items():
            if ops.data_ptr(inputs[i]) != p or ops.layout(inputs[i]) != m.tangent_layouts[i]:
                self._warn("elsewhere", "an incoming gradient is not where the backward's capture read it (the "
                                        "graph that made it ran without a graph, or another did); such backwards "
                                        "run without a graph")
                return self._plain_bw(inputs)
        moves = [(dst, inputs[i]) for i, dst in m.tangents.items() if ops.data_ptr(dst) != ops.data_ptr(inputs[i])]
        ops.copy_all([d for d, _ in moves], [s for _, s in moves])
        del inputs, moves
        m.chain.replay(1)
        self.replays["backward"] += 1
        return m.bw_out.take(())

    def _takes(self, m: _TrainMember, inputs: list) -> bool:
        """Whether inputs are for member m's backward: its saved activations
        at their addresses, incoming gradients of its shapes."""
        ops = self.ops
        return ops.ptrs_equal(inputs, m.bw_ptrs, m.bw_static) and all(
            ops.is_tensor(inputs[i]) and ops.shape_key(inputs[i]) == k for i, k in m.tangent_keys.items())

    def _plain_fw(self, inputs: list, shape: Optional[Hashable]) -> Any:
        """Inductor's forward without a graph; at a shape not learned yet,
        noting its inputs and outputs, in the warm-up pool."""
        ops = self.ops
        self.plain["forward"] += 1
        self.plain_shape = shape
        if shape is None or shape in self.learned:
            return self.fw.inner(inputs)
        self.fw_in_meta = [ops.meta(x) if ops.is_tensor(x) else None for x in inputs]
        outs = self._warm(self.fw, inputs)
        self.fw_out_meta = [ops.meta(o) if ops.is_tensor(o) else None for o in outs]
        return outs

    def _plain_bw(self, inputs: list, warm: bool = False) -> Any:
        """Inductor's backward without a graph (learning a shape: as :meth:`_warm`)."""
        self.plain["backward"] += 1
        if not warm:
            return self.bw.inner(inputs)
        return self._warm(self.bw, inputs)

    def _warm(self, r: _Runner, inputs: list) -> Any:
        """A call that learns its shape, before the capture: inductor's code
        in the warm-up pool, on the capture stream, as CUDAGraph Trees warm
        up (see _Ops.on_capture_stream: the forward in the program's thread
        and the backward in autograd's take turns on the captures' one
        workspace, and the program's stream makes none beside it), its
        outputs (saved activations, gradients) marked as used on the
        program's stream, which autograd sees them made on."""
        ops, dev = self.ops, r.device
        if dev is None:
            with _warm_pool(ops, dev):
                return r.inner(inputs)
        with ops.on_capture_stream(dev), _warm_pool(ops, dev):
            outs = r.inner(inputs)
        ops.used_here(outs, dev)
        return outs

    def _release_grads(self, m: _TrainMember) -> bool:
        """Whether m's chain may replay with respect to the gradients its
        last backward returned: those still held (AccumulateGrad keeps a
        gradient as ``.grad`` when the parameter had none: gradient
        accumulation, ``zero_grad(set_to_none=False)``) are moved out of the
        arena first, into memory of their own, so that the replay, which
        writes there, leaves them as they are; later backwards' gradients
        are then added into them in place, as without graphs. From then on
        the backward's outputs are no longer registered as cached, so that
        AccumulateGrad copies them into a ``.grad`` of its own rather than
        keep the arena's memory (one copy per accumulation, as the move
        was). False (with one warning; that call runs without a graph)
        where one cannot be moved: a tensor not found shares its memory (a
        view of a ``.grad``)."""
        out = m.bw_out
        held = out.held() if out is not None else None
        if not held:
            return True
        out.uncache()
        ops = self.ops
        # AccumulateGrad keeps a detached alias of the gradient (another
        # tensor over its memory): found through the parameters.
        # By storage (two outputs at one address have storages of their
        # own): the tensors over it, by identity.
        groups: Dict[int, Dict[int, Any]] = {}
        extra: Dict[int, int] = {}
        for i in held:
            t = out.current(i)
            if ops.extent(t)[0] in m.grad_ptrs:
                k = ops.storage_id(t)
                groups.setdefault(k, {})[id(t)] = t
                extra[k] = out.extra_refs(i)
        for t in [ops.grad(x) for x in m.fw_args]:
            if t is not None and ops.is_tensor(t) and ops.extent(t)[0] in m.grad_ptrs:
                groups.setdefault(ops.storage_id(t), {})[id(t)] = t
        t = None
        for k, group in groups.items():
            if not ops.move_out(list(group.values()), extra.get(k, 0)):
                break
        groups.clear()
        # The outputs moved are the program's now; the next replay's are new.
        left = False
        for i in held:
            if ops.extent(out.current(i))[0] in m.grad_ptrs:
                left = True
            else:
                out.forget(i)
        if left:
            self._warn("grads", "the previous backward's gradients are still held where they cannot be moved "
                                "out of the arena (a view of one is held): calls run without a graph until they "
                                "are released")
            return False
        self.grads_moved += 1
        return True

    # Capture.
    def _learn(self, inputs: list, shape: Hashable) -> None:
        """Which backward inputs are the forward's outputs (saved
        activations), its inputs, or incoming gradients (placeholders made
        for those, at this shape)."""
        ops, bw = self.ops, self.bw
        outs = {m: j for j, m in reversed(list(enumerate(self.fw_out_meta or []))) if m is not None}
        ins = {m: k for k, m in reversed(list(enumerate(self.fw_in_meta or []))) if m is not None}
        static = set(bw.static)
        m: List[Tuple[str, Any]] = []
        tangents: Dict[int, Any] = {}
        for i, x in enumerate(inputs):
            if not ops.is_tensor(x):
                m.append(("val", x))
                continue
            key = ops.meta(x)
            if key in outs:
                m.append(("fw", outs[key]))
            elif key in ins:
                m.append(("fwin", ins[key]))
            elif i in static:
                return  # a saved input the last plain forward did not make: not its backward
            else:
                m.append(("tan", None))
                tangents[i] = x
            d = ops.device(x)[0]
            if d != "cuda" and not (m[-1][0] == "fw" and ops.is_scalar(x)):
                # A forward's 0-dim output on the host (the random seed and
                # offset of SDPA's efficient attention outside a capture;
                # inside it they are device tensors) goes with the chain;
                # any other host tensor cannot.
                self._give_up(f"a backward input is on the {d} device")
                return
        kinds = [(k, v if k != "val" else None) for k, v in m]
        if self.bw_map is None:
            self.bw_map = m
            self.saved_idxs = sorted({v for k, v in m if k == "fw"})
            self.saved_set = set(self.saved_idxs)
        elif kinds != [(k, v if k != "val" else None) for k, v in self.bw_map]:
            self._warn("structure", "the backward takes its inputs from other places at another shape; that "
                                    "shape runs without a graph")
            return
        # The incoming gradients' layouts; the values that are not tensors
        # (a dynamic graph's sizes) are this shape's.
        self.learned[shape] = {i: (ops.layout(x), ops.shape_key(x)) for i, x in tangents.items()}
        self.learned_vals[shape] = {i: v for i, (k, v) in enumerate(m) if k == "val"}

    def _build(self, inputs: list, shape: Hashable) -> Optional[_TrainMember]:
        fw, bw, ops = self.fw, self.bw, self.ops
        if not ops.can_make_outputs():
            self._give_up("this torch cannot make tensors over a graph's outputs "
                          "(torch._C._construct_storage_from_data_pointer, Tensor._use_count)")
            return None
        m = _TrainMember(shape)
        static = set(fw.static)
        args, ptrs, nbytes, inplace = [], [None] * len(inputs), 0, []
        with _lock:
            fixed = {p for p, owner in _fixed_outputs.items() if owner != id(self)}
        for i, x in enumerate(inputs):
            if i in static:
                args.append(x)
                ptrs[i] = ops.data_ptr(x)
            elif ops.is_tensor(x) and ops.data_ptr(x) in fixed:
                args.append(x)  # another captured graph's output: read in place
                ptrs[i] = ops.data_ptr(x)
                inplace.append(i)
            elif ops.is_tensor(x):
                p = ops.placeholder(x)
                ops.copy(p, x)
                args.append(p)
                nbytes += ops.nbytes(x)
            else:
                args.append(x)
        learned, vals = self.learned[shape], self.learned_vals[shape]
        bw_map, saved = self.bw_map, self.saved_set
        inner_fw, inner_bw = fw.inner, bw.inner
        # The recording pass's incoming gradients: zeros outside the arena,
        # dropped once the chain is planned (the backward's capture, at its
        # first call, reads the real ones in place or from placeholders).
        tan = m.tan
        for i, (layout, _) in learned.items():
            tan[i] = ops.empty(layout)
            ops.zero(tan[i])

        def forward(_box):
            return inner_fw(list(args))

        def backward(box):
            outs = box.pop()
            a = [outs[v] if kind == "fw" else args[v] if kind == "fwin" else tan[i] if kind == "tan" else vals[i]
                 for i, (kind, v) in enumerate(bw_map)]
            keep = [o for j, o in enumerate(outs) if j not in saved]  # the forward's other outputs stay live
            del outs
            r = inner_bw(a)
            del keep
            return r
        try:
            ch = ops.capture_chain([forward, backward], f"{self.name}:{len(self.members)}", fw.device, self.opts,
                                   capture=1)
        except Exception as e:  # noqa: BLE001 - any failure means: run without a graph
            self._give_up(f"capture failed: {type(e).__name__}: {e}")
            return None
        finally:
            tan.clear()
        m.chain, m.fw_args, m.fw_ptrs, m.bw_stage = ch, args, ptrs, backward
        m.fw_check, m.fw_inplace = sorted(static | set(inplace)), set(inplace)
        self._fix(ch.outputs[0])
        m.tangent_layouts = {i: layout for i, (layout, _) in learned.items()}
        m.tangent_keys = {i: key for i, (_, key) in learned.items()}
        m.fw_out = _Outputs(ops, ch.outputs[0])
        # The backward inputs that are the forward's device outputs: each
        # call checks they are the last forward replay's.
        m.saved_cuda = [i for i, (kind, v) in enumerate(bw_map)
                        if kind == "fw" and ops.device(ch.outputs[0][v])[0] == "cuda"]
        m.rep = bw_map[m.saved_cuda[0]][1] if m.saved_cuda else None
        m.user_idx = [j for j, o in enumerate(ch.outputs[0]) if ops.is_tensor(o) and j not in saved]
        m.bw_ptrs = [None] * len(bw_map)
        for i, (kind, v) in enumerate(bw_map):
            if kind == "fw":
                p = ops.data_ptr(ch.outputs[0][v])
            elif kind == "fwin" and v in static:
                p = ptrs[v]
            else:
                continue
            m.bw_ptrs[i] = p
            m.bw_static.append(i)
        m.placeholder_bytes = nbytes
        self.members[shape] = m
        return m

    def _fix(self, outs: Sequence[Any]) -> None:
        """Note a captured stage's device outputs as this pair's fixed
        addresses (other graphs read them in place)."""
        ops = self.ops
        with _lock:
            for o in outs:
                if ops.is_tensor(o) and ops.device(o)[0] == "cuda":
                    _fixed_outputs[ops.data_ptr(o)] = id(self)

    def _capture_bw(self, m: _TrainMember, inputs: list) -> bool:
        """Capture m's backward at its first call: an incoming gradient at
        another captured graph's fixed output address, in its learned
        layout, is read there in place; others get a placeholder, copied
        into before each replay. False (with one warning, everything later
        without a graph) when the capture fails."""
        ops = self.ops
        with _lock:
            fixed = {p for p, owner in _fixed_outputs.items() if owner != id(self)}
        for i, layout in m.tangent_layouts.items():
            x = inputs[i]
            p = ops.data_ptr(x)
            if p in fixed and ops.layout(x) == layout:
                m.tan[i] = ops.at(p, layout)
                m.tangent_inplace[i] = p
            else:
                m.tan[i] = m.tangents[i] = ops.empty(layout)
        try:
            out = m.chain.capture(m.bw_stage)
        except Exception as e:  # noqa: BLE001 - any failure means: run without a graph
            m.tangents.clear()
            m.tangent_inplace.clear()
            self._give_up(f"capture of the backward failed: {type(e).__name__}: {e}")
            return False
        finally:
            m.tan.clear()
        self._fix(out)
        m.grad_ptrs = {ops.extent(t)[0] for t in out if ops.is_tensor(t)}
        m.bw_out = _Outputs(ops, out, cached=True)
        m.placeholder_bytes += sum(ops.nbytes(t) for t in m.tangents.values())
        return True

    def report(self, r: _Runner) -> Dict[str, Any]:
        """Per part (forward or backward); the forward's also carries the
        chains' figures, summed over the shapes (one arena each)."""
        part = "forward" if r is self.fw else "backward"
        ms = [m for m in self.members.values() if m.chain is not None]
        out: Dict[str, Any] = {"graph": r.name, "training": part, "captured": bool(ms), "reason": self.reason,
                               "members": len(ms), "captures": len(ms), "replays": self.replays[part],
                               "plain_calls": self.plain[part],
                               "input_bytes_outside": sum(m.placeholder_bytes for m in ms),
                               "from_mode": self.opts.from_mode}
        if part == "backward":
            out["incoming_in_place"] = sum(len(m.tangent_inplace) for m in ms)
        if ms and part == "forward":
            reps = [m.chain.report() for m in ms]
            for k in ("arena", "lower_bound", "arena_mapped", "spill_held", "graph_bytes", "plan_build_ms"):
                if all(k in c for c in reps):
                    out[k] = sum(c[k] for c in reps)
            if out.get("lower_bound"):
                out["ratio"] = out["arena"] / out["lower_bound"]
            out["capture_ms"] = sum(sum(c.get("capture_ms", {}).values()) for c in reps)
        return out

    def close(self) -> None:
        for m in self.members.values():
            # Gradients still held as .grad keep their values (moved out);
            # any other output still held raises when read.
            self._release_grads(m)
            for out in (m.fw_out, m.bw_out):
                if out is not None:
                    out.release()
            if m.chain is not None:
                m.chain.close()
                m.chain = None
        self.members.clear()
        with _lock:
            for p in [p for p, owner in _fixed_outputs.items() if owner == id(self)]:
                del _fixed_outputs[p]
