"""arenaplan.compile's logic without torch or a GPU: the backend's options,
its registration, and what a compiled graph's wrapper does call by call
(plain warm-up calls, one capture, replays that copy only the inputs that
are not parameters or buffers, to addresses planned in the arena, members
per shape and parameter address in one family, the limit, give-ups with
one warning, outputs of an earlier call made unreadable), over a stand-in
for torch and arenaplan.torch whose device memory holds values, so that
what a replay reads is checked.
"""
import contextlib
import functools
import gc
import os
import sys
import types
import unittest
import warnings
import weakref

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class _Memory:
    """Stand-in memory, one byte an element: a write over [start, end)
    replaces every value whose range it overlaps; a read of a range returns
    the value last written over exactly that range, "garbage" where a later
    write overlapped it."""

    def __init__(self):
        self.cells = {}

    @staticmethod
    def _key(t):
        return (t.device[0], t.ptr, t.ptr + max(_size(t.shape), 1))

    def read(self, t):
        return self.cells.get(self._key(t), "garbage")

    def write(self, t, value):
        space, lo, hi = k = self._key(t)
        for c in [c for c in self.cells if c[0] == space and c[1] < hi and lo < c[2]]:
            del self.cells[c]
        self.cells[k] = value


_MEM = _Memory()


class _Tensor:
    """A stand-in tensor: a shape, a device and an address; its value is
    what _MEM holds there."""
    _next = 0x1000

    def __init__(self, shape, device=("cuda", 0), ptr=None, value=None):
        self.shape, self.device = tuple(shape), device
        if ptr is None:
            _Tensor._next += 0x1000
            ptr = _Tensor._next
        self.ptr = ptr
        self.copied_from = []
        if value is not None:
            self.value = value

    @property
    def value(self):
        return _MEM.read(self)

    @value.setter
    def value(self, v):
        _MEM.write(self, v)


def _import_compile():
    """Import arenaplan.compile over a stand-in torch, then take the stand-in
    out of sys.modules again (other tests bring their own)."""
    registry = types.ModuleType("torch._dynamo.backends.registry")
    registry._BACKENDS = {}

    def register_backend(compiler_fn=None, name=None, tags=()):
        assert name not in registry._BACKENDS, f"duplicate name: {name}"
        registry._BACKENDS[name] = compiler_fn
        return compiler_fn
    registry.register_backend = register_backend
    torch = types.ModuleType("torch")
    torch.Tensor = _Tensor
    torch._C = types.SimpleNamespace()
    mods = {"torch": torch, "torch._dynamo": types.ModuleType("torch._dynamo"),
            "torch._dynamo.backends": types.ModuleType("torch._dynamo.backends"),
            "torch._dynamo.backends.registry": registry}
    ours = [k for k in sys.modules if k == "arenaplan.compile" or k.startswith("arenaplan.compile.")]
    saved = {k: sys.modules.get(k) for k in list(mods) + ours}
    sys.modules.update(mods)
    for k in ours:
        sys.modules.pop(k, None)
    try:
        import arenaplan.compile as apc
    finally:
        for k, v in saved.items():
            if k.startswith("arenaplan.compile"):
                continue
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return apc, registry


apc, REGISTRY = _import_compile()
from arenaplan._lib import ArenaplanError  # noqa: E402 - after the stand-in torch


class _Family:
    """arenaplan.torch.graphs: per member ``warmup`` runs (the last one
    recorded), then ``captures`` captures (two where a capture diverged from
    the recorded run), each allocating from the arena's start (a member
    added ``around`` held ranges: past each of them, the arena grown where
    it then needs more); a replay runs the kernels the member's last
    capture recorded."""

    def __init__(self, fns, log, ops, warmup, captures=1):
        self.keys = list(fns)
        self.outputs, self.kernels = {}, {}
        self.replays = []
        self.closed = self.paused = False
        self.base = ops.new_arena()
        for k, fn in fns.items():
            for _ in range(warmup):
                out = fn()
                del out
        self.ops, self.warmup, self.size = ops, warmup, 0
        self.grown, self.around = 0, {}  # growths in place; per member added around held memory: the ranges
        self.replanned = []  # the members planned again around held memory, in turn
        self.recaptured = []  # the members captured once more on their plans, in turn
        self.refuse = False  # refuse every plan made again (as the library may)
        for k, fn in fns.items():
            for c in range(captures):
                self._capture(k, fn, self.base + c * 0x10000)
        log.append(self)

    def _capture(self, k, fn, base):
        ops = self.ops
        ops.capturing_now, ops.cursor, ops.kernels, ops.top = True, base, [], base
        try:
            out = fn()
        finally:
            ops.capturing_now = False
        self.outputs[k], self.kernels[k] = out, ops.kernels
        self.last_base = base
        used = max(ops.cursor, ops.top) - base
        self.size = max(self.size, used)
        return used

    def add(self, key, fn, around=()):
        """GraphFamily.add: warm-up runs, one capture at the arena's start;
        refused, the family unchanged, when it needs more than the arena,
        but for a member planned around held ranges, which grows it."""
        for _ in range(self.warmup):
            out = fn()
            del out
        size, outputs, kernels = self.size, dict(self.outputs), dict(self.kernels)
        self.ops.avoid = list(around)
        try:
            used = self._capture(key, fn, self.base)
        finally:
            self.ops.avoid = []
        if used > size:
            if not around:
                self.size, self.outputs, self.kernels = size, outputs, kernels
                raise ArenaplanError("arenaplan: member needs more: does not fit in the family's arena")
            self.grown += 1
        if around:
            self.around[key] = list(around)
        self.keys.append(key)

    def replan_around(self, key, fn, around):
        """GraphFamily.replan_around: captured once more at the arena's start
        past every range it is now planned around, its outputs where they
        were, the arena grown where it needs more; refused, the member
        captured again as it was, where a range meets one of its outputs
        (they stay where they are)."""
        self.replanned.append(key)
        spans = [(o.ptr, o.ptr + _size(o.shape)) for o in self.outputs[key]]
        refused = self.refuse or any(a < hi and lo < b for lo, hi in around for a, b in spans)
        size = self.size
        self.ops.avoid = list(self.around.get(key, [])) if refused else list(around)
        try:
            used = self._capture(key, fn, self.base)
        finally:
            self.ops.avoid = []
        assert [(o.ptr, o.ptr + _size(o.shape)) for o in self.outputs[key]] == spans, "its outputs stay"
        if refused:
            raise ArenaplanError("arenaplan: a held range meets one of the member's outputs")
        self.grown += used > size
        self.around[key] = list(around)

    def recapture(self, key, fn):
        """GraphFamily.recapture: captured once more on its plan (at the
        arena's start, past the ranges it was planned around), no eager
        run."""
        self.recaptured.append(key)
        self.ops.avoid = list(self.around.get(key, []))
        try:
            self._capture(key, fn, self.base)
        finally:
            self.ops.avoid = []

    def prepare(self):
        assert not self.closed
        if self.paused:
            raise RuntimeError("arenaplan: the graphs' memory of device 0 is paused")
        self.prepared = True

    def replay(self, key, prepared=False):
        # prepared=True only right after prepare(), as GraphFamily.replay asks.
        assert not prepared or getattr(self, "prepared", False), "replay(prepared=True) without prepare()"
        if not prepared:
            self.prepare()
        self.prepared = False
        self.replays.append(key)
        for k in self.kernels[key]:
            k()
        return self.outputs[key]

    def report(self):
        return {"arena": 1000, "lower_bound": 1000, "ratio": 1.0, "arena_mapped": 1024, "spill_held": 0,
                "graph_bytes": 1024, "capture_ms": {k: 1.0 for k in self.keys}}

    def close(self):
        self.closed = True


class _FakeOps(apc._Ops):
    """arenaplan.compile._Ops over stand-in tensors and families."""

    def __init__(self, fail=None, captures=1):
        self.families, self.denied, self.fail = [], [], fail
        self.view_calls = 0
        self.cached = set()  # ids of the tensors registered as cached outputs
        self.captures = captures
        self.capturing_now, self.cursor, self.kernels = False, 0, []
        self.avoid, self.top = [], 0  # ranges a capture's allocations skip; the highest end allocated
        self.arenas = 0
        self.made = []  # weak references to the tensors empty() made
        self.copies = []  # (dst address, src address)
        self.pools = []  # the warm-up pools made
        self.routed = []  # per block routed to a pool: its index in pools
        self.rng = 0  # the stand-in CUDA generator: random numbers drawn so far
        self.stream_now = False  # inside on_capture_stream's block
        self.stream_blocks = []  # per such block: its device
        self.used = []  # the outputs used_here marked

    @contextlib.contextmanager
    def on_capture_stream(self, device):
        assert not self.stream_now, "on the capture stream twice"
        self.stream_blocks.append(device)
        self.stream_now = True
        try:
            yield
        finally:
            self.stream_now = False

    def used_here(self, outs, device):
        self.used.extend(outs if isinstance(outs, (list, tuple)) else [outs])

    def rng_state(self, device):
        return self.rng

    def set_rng_state(self, state, device):
        self.rng = state

    def warm_pool(self):
        p = types.SimpleNamespace(closed=False, index=len(self.pools))
        self.pools.append(p)
        return p

    @contextlib.contextmanager
    def in_pool(self, pool, device):
        assert not pool.closed, "a block routed to a closed pool"
        self.routed.append(pool.index)
        yield
        assert not pool.closed, "a pool closed while routed to"

    @staticmethod
    def close_pool(pool):
        assert not pool.closed, "a pool closed twice"
        pool.closed = True

    def new_arena(self):
        self.arenas += 1
        return 0x40000000 + self.arenas * 0x1000000

    @staticmethod
    def layout(t):
        return (t.shape, t.device)

    def place(self, ptr, n):
        """The plan's address of n bytes wanted at ptr: past every range
        the member is planned around that they would meet. (The stand-in
        arena's size counts the copied inputs, and an output only where a
        held range pushed it up.)"""
        moved, at = True, ptr
        while moved:
            moved = False
            for lo, hi in self.avoid:
                if ptr < hi and lo < ptr + n:
                    ptr, moved = hi, True
        if ptr != at:
            self.top = max(self.top, ptr + n)  # what it took past a held range counts in the arena
        return ptr

    def empty(self, layout):
        """Inside a capture, at the arena's cursor (the plan's address)."""
        ptr = None
        if self.capturing_now:
            ptr = self.place(self.cursor, _size(layout[0]))
            self.cursor = ptr + _size(layout[0])
        t = _Tensor(layout[0], layout[1], ptr)
        self.made.append(weakref.ref(t))
        return t

    @staticmethod
    def at(ptr, layout):
        return _Tensor(layout[0], layout[1], ptr)

    def capturing(self):
        return self.capturing_now

    @staticmethod
    def host(t):
        return _Tensor((_size(t.shape),), ("cpu", None), value=t.value)

    @staticmethod
    def fill(dst, src):
        assert src.device[0] == "cpu" or src.shape == dst.shape
        dst.value = src.value

    @staticmethod
    def extent(t):
        return (t.ptr, t.ptr + _size(t.shape))

    def installed(self):
        return True

    @staticmethod
    def is_tensor(x):
        return isinstance(x, _Tensor)

    @staticmethod
    def device(t):
        return t.device

    @staticmethod
    def shape_key(t):
        return t.shape

    @staticmethod
    def data_ptr(t):
        if getattr(t, "denied", False):
            raise RuntimeError("read of a denied output")
        return t.ptr

    @staticmethod
    def nbytes(t):
        n = 1
        for d in t.shape:
            n *= d
        return n

    def ptrs_equal(self, args, ptrs, idxs):
        return all(args[i].ptr == ptrs[i] for i in idxs)

    @staticmethod
    def placeholder(t):
        return _Tensor(t.shape, t.device)

    def copy(self, dst, src):
        a, b = self.extent(dst), self.extent(src)
        assert a == b or not (a[0] < b[1] and b[0] < a[1]), "a copy over its own source"
        dst.copied_from.append(src.ptr)
        self.copies.append((dst.ptr, src.ptr))
        dst.value = src.value

    def copy_all(self, dsts, srcs):
        assert len(dsts) == len(srcs)
        for d, s in zip(dsts, srcs):
            self.copy(d, s)

    def capture(self, fns, name, device, opts):
        if self.fail:
            raise RuntimeError(self.fail)
        return _Family(fns, self.families, self, opts.capture_warmup, self.captures)

    @staticmethod
    def add_member(fam, key, fn, device, opts, around=()):
        fam.add(key, fn, around)

    @staticmethod
    def replan_member(fam, key, fn, around, device, opts):
        fam.replan_around(key, fn, around)

    @staticmethod
    def recapture_member(fam, key, fn, device, opts):
        fam.recapture(key, fn)

    def output_makers(self, outs):
        def maker(o):
            def make():
                self.view_calls += 1
                return self.output(o), True
            return make
        return [maker(o) for o in outs]

    @staticmethod
    def output(o):
        t = _Tensor(o.shape, o.device, o.ptr)
        t.storage = _Storage()
        return t

    @staticmethod
    def extra_refs(token):
        return 0

    @staticmethod
    def move_out(ts, extra=0):
        """Refused where a view shares their storage (the test marks it), or
        where they are not all over one storage (as the real count of the
        storage's holders would not match)."""
        if getattr(ts[0].storage, "views", 0) or len({id(t.storage) for t in ts}) != 1:
            return False
        v = ts[0].value
        _Tensor._next += 0x1000
        st = _Storage()
        for t in ts:
            t.ptr, t.storage = _Tensor._next, st
        ts[0].value = v
        return True

    @staticmethod
    def can_make_outputs():
        return True

    @staticmethod
    def held_outputs(slots, tokens):
        # Held: a reference besides the list's and the argument's, to the
        # tensor or (a view) to its storage.
        return [i for i, tok in enumerate(tokens) if tok is not None and
                (sys.getrefcount(slots[i]) > 2 or
                 (getattr(slots[i], "storage", None) is not None and sys.getrefcount(slots[i].storage) > 2))]

    @staticmethod
    def can_cache():
        return True

    def set_cached(self, t, on):
        (self.cached.add if on else self.cached.discard)(id(t))

    def deny(self, outs):
        for o in outs:
            o.denied = True
            self.denied.append(o)


class _Inner:
    """Inductor's compiled graph: records the inputs of every call, empties
    the list (the boxed convention) and returns one output per call."""

    def __init__(self, ops=None):
        self.calls = []
        self.ops = ops
        self.on_stream = []  # per call: whether it ran on the capture stream

    def __call__(self, args):
        self.calls.append(list(args))
        self.on_stream.append(bool(self.ops and self.ops.stream_now))
        args.clear()
        return (_Tensor((1,)),)


def _runner(reason=None, frame=None, ops=None, name="graph0", **options):
    ops = ops or _FakeOps(options.pop("fail", None))
    inner = _Inner(ops)
    opts = apc.CompileOptions(None, options)
    r = apc._Runner(inner, name, static_idxs=[0, 1], reason=reason, opts=opts, ops=ops, device=0, frame=frame)
    return r, inner, ops


class OptionsTest(unittest.TestCase):
    def test_defaults_and_inductor_patches(self):
        o = apc.CompileOptions()
        self.assertEqual((o.warmup, o.capture_warmup, o.max_shapes, o.capture), (1, 2, 8, True))
        modes = lambda m: {"max_autotune": True, "triton.cudagraphs": True}  # noqa: E731
        self.assertEqual(o.inductor_patches(modes), {"triton.cudagraphs": False})
        o = apc.CompileOptions("max-autotune", {"warmup": 2, "coordinate_descent_tuning": True, "budget": 2})
        self.assertEqual((o.warmup, o.budget), (2, 2.0))
        self.assertEqual(o.inductor_patches(modes), {"max_autotune": True, "coordinate_descent_tuning": True,
                                                     "triton.cudagraphs": False})
        # reduce-overhead's own CUDA graphs are what this backend replaces.
        self.assertEqual(apc.CompileOptions("reduce-overhead").inductor_patches(modes), {"triton.cudagraphs": False})

    def test_routed_request_keeps_its_mode(self):
        # torch.compile(mode="max-autotune") routed here: its inductor options, our graphs.
        o = apc.CompileOptions(None, {"from_mode": "max-autotune"})
        self.assertEqual((o.mode, o.from_mode), ("max-autotune", "max-autotune"))
        self.assertEqual(o.inductor, {}, "from_mode is the backend's, not an inductor patch")
        o = apc.CompileOptions(None, {"from_mode": "torch._inductor.config.triton.cudagraphs = True"})
        self.assertEqual(o.mode, "default")
        r, _, _ = _runner(from_mode="reduce-overhead")
        self.assertEqual(r.report()["from_mode"], "reduce-overhead")

    def test_bad_options_raise(self):
        for mode, options in [("fast", None), (None, {"warmup": -1}), (None, {"warmup": True}),
                              (None, {"max_shapes": 0}), (None, {"capture_warmup": 0}), (None, {"budget": 0}),
                              (None, {"strict": 1}), (None, {"triton.cudagraphs": True})]:
            with self.assertRaises(ValueError, msg=f"{mode} {options}"):
                apc.CompileOptions(mode, options)


class RegistrationTest(unittest.TestCase):
    def test_registered_once(self):
        self.assertIs(REGISTRY._BACKENDS["arenaplan"], apc.backend)
        apc._register()  # a second import path (the entry point) registers nothing twice
        self.assertEqual(list(REGISTRY._BACKENDS), ["arenaplan"])


class RunnerTest(unittest.TestCase):
    def test_boxed_through_a_wrapper(self):
        # dynamo's disable() wraps AOTAutograd's backward with functools.wraps;
        # AOTAutograd hands a list only to what says _boxed_call, else unpacks
        # the list into arguments it holds until the call returns (every
        # saved activation kept alive through the whole backward).
        r, inner, _ = _runner(warmup=3)

        @functools.wraps(r)
        def wrapper(*a, **k):
            return r(*a, **k)

        args = [_Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4)), 3]
        self.assertTrue(getattr(wrapper, "_boxed_call", False), "the wrapper says it takes a list")
        wrapper(args)
        self.assertEqual(args, [], "the caller's list is emptied: it holds no input through the call")
        self.assertEqual(len(inner.calls), 1)

    def test_warmup_calls_run_on_the_capture_stream(self):
        # A warm-up call runs where the captures run, so that its matrix
        # products use the capture stream's workspaces and not the
        # program's stream's made anew beside them; its outputs are marked
        # as used on the program's stream. Calls without a graph for other
        # reasons run where the program runs.
        r, inner, ops = _runner(warmup=2)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        outs = [r([w0, w1, _Tensor((8, 4)), 3]) for _ in range(2)]
        self.assertEqual(inner.on_stream, [True, True])
        self.assertEqual([id(o) for o in ops.used], [id(o[0]) for o in outs])
        r([w0, w1, _Tensor((8, 4)), 3])
        self.assertEqual(len(ops.families), 1)
        self.assertEqual(inner.on_stream[2:], [False] * (len(inner.calls) - 2),
                         "the family's runs and capture are its own")
        gave_up, inner, ops = _runner(reason="a test", warmup=2)
        gave_up([w0, w1, _Tensor((8, 4)), 3])
        self.assertEqual((inner.on_stream, ops.used), ([False], []))

    def test_outputs_reused_while_nothing_holds_them(self):
        r, inner, ops = _runner(warmup=0)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        first = id(r([w0, w1, _Tensor((8, 4)), 3])[0])  # captured and replayed
        made = ops.view_calls
        for _ in range(3):
            self.assertEqual(id(r([w0, w1, _Tensor((8, 4)), 3])[0]), first, "not held: the same tensor again")
        self.assertEqual(ops.view_calls, made)
        held = r([w0, w1, _Tensor((8, 4)), 3])
        again = r([w0, w1, _Tensor((8, 4)), 3])
        self.assertIsNot(held[0], again[0], "held by the caller: a new one")
        self.assertTrue(held[0].denied)
        self.assertEqual(held[0].ptr, again[0].ptr)

    def test_warmup_capture_replay(self):
        r, inner, ops = _runner()
        w0, w1, x = _Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4), value="x")
        args = [w0, w1, x, 3]
        out0 = r(args)
        self.assertEqual(args, [], "the boxed convention: the list of inputs is emptied")
        self.assertEqual(len(inner.calls), 1)
        self.assertEqual(inner.calls[0], [w0, w1, x, 3], "the warm-up call runs inductor's code on the inputs")
        self.assertEqual(ops.families, [])
        out1 = r([w0, w1, x, 3])
        fam = ops.families[0]
        self.assertEqual(ops.routed, [], "an inference graph's calls allocate as any other")
        self.assertEqual(len(inner.calls), 4, "two runs before the capture (the last recorded), one captured")
        for run in inner.calls[1:]:
            self.assertIs(run[0], w0)
            self.assertIs(run[1], w1)
            self.assertIsNot(run[2], x, "a non-static input is the step's own tensor")
            self.assertEqual(run[3], 3)
        self.assertEqual([run[2].value for run in inner.calls[1:3]], ["x", "x"],
                         "the runs before the capture read the input's values")
        cap = inner.calls[3][2]
        self.assertEqual(cap.ptr, fam.base, "captured at its planned address")
        self.assertEqual(cap.copied_from, [], "no copy inside the capture")
        self.assertEqual(fam.replays, [0])
        self.assertEqual(ops.copies[-1], (fam.base, x.ptr), "the first replay's input copied to that address")
        x2 = _Tensor((8, 4), value="x2")
        out2 = r([w0, w1, x2, 3])
        self.assertEqual(len(inner.calls), 4, "replays run no Python of the step")
        self.assertEqual(ops.copies[-1], (fam.base, x2.ptr))
        self.assertEqual(_Tensor((8, 4), ptr=fam.base).value, "x2")
        self.assertEqual(fam.replays, [0, 0])
        self.assertFalse(getattr(out0[0], "denied", False), "a plain call's outputs are the caller's")
        self.assertTrue(out1[0].denied, "the previous replay's outputs are overwritten")
        self.assertFalse(getattr(out2[0], "denied", False))
        self.assertEqual(out1[0].ptr, out2[0].ptr, "outputs at fixed addresses")
        self.assertIsNot(out1[0], out2[0])
        # A tensor at the planned address as input: nothing to copy.
        n = len(ops.copies)
        r([w0, w1, _Tensor((8, 4), ptr=fam.base), 3])
        self.assertEqual(len(ops.copies), n)
        rep = r.report()
        self.assertEqual((rep["captured"], rep["members"], rep["captures"], rep["replays"], rep["plain_calls"]),
                         (True, 1, 1, 3, 1))
        self.assertEqual((rep["static_inputs"], rep["other_inputs"], rep["input_bytes_planned"],
                          rep["input_bytes_outside"]), (2, 2, 32, 0))
        self.assertEqual((rep["arena"], rep["lower_bound"], rep["graph_bytes"]), (1000, 1000, 1024))

    def test_parameters_elsewhere_make_another_member(self):
        r, inner, ops = _runner(warmup=0)
        w0, w1, x = _Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4))
        r([w0, w1, x, 3])
        v0 = _Tensor((4, 4))
        r([v0, w1, x, 3])
        self.assertEqual(len(ops.families), 1, "the new member joins the family's arena")
        self.assertFalse(ops.families[0].closed)
        self.assertEqual(ops.families[0].replays, [0, 1])
        r([w0, w1, x, 3])
        self.assertEqual(ops.families[0].replays, [0, 1, 0])
        self.assertEqual(r.report()["members"], 2)

    def test_another_members_held_outputs_move_out_before_its_replay(self):
        # a = f(x8); b = f(x2); use(a): the second shape's replay writes the
        # family's arena where a lives; a is moved into memory of its own
        # first (CUDAGraph Trees keep one graph's live outputs from
        # another's), a held view of it cannot follow: denied.
        r, inner, ops = _runner(warmup=0)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        a = r([w0, w1, _Tensor((8, 4)), 8])
        at = a[0].ptr
        a[0].value = "a"
        b = r([w0, w1, _Tensor((2, 4)), 2])
        fam = ops.families[-1]
        self.assertEqual(fam.replays[-1], 1, "the second member replayed")
        self.assertFalse(getattr(a[0], "denied", False), "a held output of the other member stays readable")
        self.assertNotEqual(a[0].ptr, at, "moved out of the arena")
        self.assertEqual(a[0].value, "a", "with its value")
        # A view held (another tensor over its memory): it cannot move, so
        # the call at the other shape runs without a graph (one warning),
        # leaving it as it is, until the view goes.
        b[0].storage.views = 1
        b[0].value = "b"
        kept, bt = b[0], b[0].ptr
        del a, b
        n = len(fam.replays)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(2):
                r([w0, w1, _Tensor((8, 4)), 8])
        self.assertEqual(len(w), 1, [str(m.message) for m in w])
        self.assertIn("a view of an output", str(w[0].message))
        self.assertEqual(len(fam.replays), n, "no replay over memory a view still reads")
        self.assertFalse(getattr(kept, "denied", False))
        self.assertEqual((kept.ptr, kept.value), (bt, "b"))
        kept.storage.views = 0
        del kept
        c = r([w0, w1, _Tensor((8, 4)), 8])
        self.assertEqual(len(fam.replays), n + 1, "replayed once the view is gone")
        # Nothing held: the same tensors come back, nothing moved.
        del c
        d = r([w0, w1, _Tensor((2, 4)), 2])
        self.assertFalse(getattr(d[0], "denied", False))
        del d
        n = ops.view_calls
        e = r([w0, w1, _Tensor((8, 4)), 8])
        self.assertEqual(ops.view_calls, n, "the first member's tensor again: nothing held it between")
        self.assertEqual(e[0].ptr, at, "in the arena")

    def test_held_output_fed_to_another_member_moves_before_the_copy_in(self):
        # b = f(a) at another shape, a the last call's output: a moves out
        # of the arena before the copy in writes there, then is copied in.
        r, inner, ops = _runner(warmup=0)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        for _ in range(2):
            a = r([w0, w1, _Tensor((8, 4)), 8])
            a[0].value = "a"
            r([w0, w1, a[0], 1])
            self.assertFalse(getattr(a[0], "denied", False))
            self.assertEqual(a[0].value, "a", "not overwritten by the copy in")
            self.assertEqual(ops.copies[-1][1], a[0].ptr, "copied in from where it went")
            del a

    def test_graphs_of_one_frame_share_one_arena(self):
        # torch.compile(model, dynamic=False) called at batches 8 and 2:
        # two graphs compiled from one frame, their members in one family.
        r8, _, ops = _runner(warmup=0, frame=7)
        r2, _, _ = _runner(warmup=0, frame=7, ops=ops, name="graph1")
        other, _, _ = _runner(warmup=0, frame=8, ops=ops, name="graph2")
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        a = r8([w0, w1, _Tensor((8, 4)), 8])
        a[0].value = "a"
        r2([w0, w1, _Tensor((2, 4)), 2])
        self.assertEqual(len(ops.families), 1, "the smaller graph joins the first one's arena")
        fam = ops.families[0]
        self.assertEqual(fam.keys, [0, 1])
        self.assertEqual(fam.replays, [0, 1])
        self.assertFalse(getattr(a[0], "denied", False), "the other graph's held output moved out")
        self.assertEqual(a[0].value, "a")
        rep8, rep2 = r8.report(), r2.report()
        self.assertTrue(rep8["captured"] and rep2["captured"])
        self.assertEqual(rep2["shares_arena_with"], "graph0")
        self.assertEqual((rep8["graph_bytes"], rep2["graph_bytes"]), (1024, 0), "the arena counted once")
        # A larger size compiled later from the frame: the family captured
        # anew, both graphs' members in it, largest first.
        r16, _, _ = _runner(warmup=0, frame=7, ops=ops, name="graph3")
        r16([w0, w1, _Tensor((16, 4)), 16])
        self.assertTrue(fam.closed)
        self.assertEqual(ops.families[-1].keys, [2, 0, 1])
        kept = r2([w0, w1, _Tensor((2, 4)), 2])
        self.assertEqual(ops.families[-1].replays[-1], 1)
        # Another frame, called while the last output is held: it joins,
        # planned around that output, which stays (see FramesTest).
        at = kept[0].ptr
        other([w0, w1, _Tensor((8, 4)), 8])
        self.assertEqual((kept[0].ptr, len(ops.families)), (at, 2))
        self.assertEqual(other.report()["shares_arena_with"], "graph0")
        del kept
        # Closing one graph drops its siblings' captures; they capture again.
        n = len(ops.families)
        r8.close()
        self.assertTrue(ops.families[-1].closed)
        self.assertFalse(r2.report()["captured"])
        r2([w0, w1, _Tensor((2, 4)), 2])
        self.assertEqual(len(ops.families), n + 1)
        self.assertTrue(r2.report()["captured"])

    def test_no_capture_anew_while_a_view_of_an_output_is_held(self):
        # Capturing the family anew gives its arena back: not while a view
        # of an output is held (it would read freed memory). The new shape
        # runs without a graph until the view goes, then is captured.
        r, inner, ops = _runner(warmup=0)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        a = r([w0, w1, _Tensor((2, 4)), 2])
        a[0].storage.views = 1
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r([w0, w1, _Tensor((16, 4)), 16])
        self.assertIn("a view of an output", str(w[0].message))
        self.assertEqual(len(ops.families), 1)
        self.assertFalse(ops.families[0].closed)
        self.assertEqual(r.report()["members"], 1, "the new shape is not a member yet")
        a[0].storage.views = 0
        del a
        r([w0, w1, _Tensor((16, 4)), 16])
        self.assertTrue(ops.families[0].closed)
        self.assertEqual(r.report()["members"], 2)

    def test_held_outputs_move_out_before_the_family_is_captured_anew(self):
        # A larger shape after a smaller one does not fit: the family is
        # captured anew and its old arena given back; an output held
        # across that moves out first.
        r, inner, ops = _runner(warmup=0)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        a = r([w0, w1, _Tensor((2, 4)), 2])
        a[0].value = "a"
        r([w0, w1, _Tensor((16, 4)), 16])
        self.assertTrue(ops.families[0].closed, "captured anew")
        self.assertFalse(getattr(a[0], "denied", False))
        self.assertEqual(a[0].value, "a")

    def test_shapes_share_a_family_up_to_the_limit(self):
        r, inner, ops = _runner(warmup=1, max_shapes=2)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        small, big, third = _Tensor((2, 4)), _Tensor((16, 4)), _Tensor((1, 4))
        r([w0, w1, small, 2])
        r([w0, w1, small, 2])
        self.assertEqual(len(ops.families), 1)
        r([w0, w1, big, 16])  # plain: its warm-up
        self.assertEqual(len(ops.families), 1)
        r([w0, w1, big, 16])
        fam = ops.families[-1]
        self.assertEqual(len(ops.families), 2)
        self.assertEqual(fam.keys, [1, 0], "the largest member first")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                r([w0, w1, third, 1])
        msgs = [str(m.message) for m in w]
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("max_shapes=2", msgs[0])
        self.assertEqual(len(ops.families), 2, "no capture beyond the limit")
        r([w0, w1, small, 2])
        self.assertEqual(fam.replays, [1, 0])
        rep = r.report()
        self.assertEqual((rep["members"], rep["captures"], rep["family_builds"]), (2, 3, 2))

    def test_cpu_input_gives_up_with_one_warning(self):
        r, inner, ops = _runner(warmup=0)
        w0, w1 = _Tensor((4, 4)), _Tensor((4,))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                r([w0, w1, _Tensor((2,), device=("cpu", None)), 1])
        self.assertEqual(len(w), 1)
        self.assertIn("cpu device", str(w[0].message))
        self.assertEqual((len(inner.calls), ops.families), (3, []))
        self.assertIn("cpu", r.report()["reason"])

    def test_capture_failure_runs_plain(self):
        r, inner, ops = _runner(warmup=0, fail="operation not permitted when stream is capturing")
        w0, w1, x = _Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                r([w0, w1, x, 1])
        self.assertEqual(len(w), 1)
        self.assertIn("capture failed: RuntimeError: operation not permitted", str(w[0].message))
        self.assertEqual(len(inner.calls), 3)
        self.assertFalse(r.report()["captured"])

    def test_refused_graph_warns_once_at_compile(self):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r, inner, ops = _runner(reason="tensors on the cpu device (arg3_1)")
            for _ in range(3):
                r([_Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4)), 1])
        self.assertEqual(len(w), 1)
        self.assertIn("graph0: tensors on the cpu device (arg3_1): inductor's code runs without a CUDA graph",
                      str(w[0].message))
        self.assertEqual((len(inner.calls), ops.families), (3, []))

    def test_report_and_reset(self):
        r, inner, ops = _runner(warmup=0)
        w0, w1, x = _Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4))
        out = r([w0, w1, x, 1])
        self.assertIn("graph0", [g["graph"] for g in apc.report()])
        apc.reset()
        self.assertTrue(ops.families[0].closed)
        self.assertTrue(out[0].denied, "outputs of a destroyed graph are unreadable")
        self.assertFalse(r.report()["captured"])
        r([w0, w1, x, 1])
        self.assertEqual(len(ops.families), 2, "captured again after reset")


class _Graph:
    """Inductor's code for out = f(inputs 1..): reads its inputs' values,
    frees them (the boxed convention, then no reference of its own), and
    writes its output; under a capture it records the kernel a replay runs
    (over the addresses it read and wrote), its output placed at
    ``out_offset`` from the start of the arena (where the plan may put it
    once the inputs are dead)."""

    def __init__(self, ops, out_offset=0x100):
        self.ops, self.out_offset = ops, out_offset
        self.seen = []  # per run: (capturing, the inputs' values)
        self.freed = []  # per run: whether every copied input was freed once the list was emptied

    def __call__(self, args):
        ops = self.ops
        ins = args[1:]
        args.clear()
        vals = tuple(t.value for t in ins)
        self.seen.append((ops.capturing_now, vals))
        shape = ins[0].shape
        reads = [_Tensor(t.shape, t.device, t.ptr) for t in ins]  # the addresses, not the tensors
        refs = [weakref.ref(t) for t in ins]
        del ins
        self.freed.append(all(w() is None for w in refs))
        if not ops.capturing_now:
            return (_Tensor(shape, value=("f",) + vals),)
        out = _Tensor(shape, ptr=ops.place(ops.cursor - ops.cursor % 0x10000 + self.out_offset, _size(shape)),
                      value=("f",) + vals)
        at = out.ptr

        def kernel():
            _Tensor(shape, ptr=at).value = ("f",) + tuple(t.value for t in reads)
        ops.kernels.append(kernel)
        return (out,)


class PlannedInputTest(unittest.TestCase):
    """Inputs that are not parameters or buffers: allocated inside the
    member's step (planned in the arena), copied to that address before
    each replay, never held outside."""

    def runner(self, static=(0,), **kw):
        ops = _FakeOps(captures=kw.pop("captures", 1))
        g = _Graph(ops, **kw)
        r = apc._Runner(g, "graph0", static_idxs=list(static), reason=None,
                        opts=apc.CompileOptions(None, {"warmup": 0}), ops=ops, device=0)
        return r, g, ops

    def assertNoneHeld(self, ops):
        gc.collect()
        self.assertTrue(ops.made)
        self.assertEqual([w() for w in ops.made if w() is not None], [],
                         "no tensor of an input's is held outside the step")

    def test_a_capture_without_the_inputs_addresses_gives_the_graph_up(self):
        # A capture that never allocated a member's copied input (here: the
        # capture is not seen as one) leaves no address to copy it to: the
        # graph runs without a graph, with a warning, and nothing raises.
        r, g, ops = self.runner()
        ops.capturing = lambda: False
        ops.arenas = 0x100  # addresses no other test's arena uses (the stand-in memory is shared)
        w = _Tensor((4,))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k in range(3):
                self.assertEqual(r([w, _Tensor((32,), value=f"x{k}")])[0].value, ("f", f"x{k}"))
        self.assertIsNone(r.family)
        self.assertTrue(ops.families[0].closed)
        self.assertTrue(any("was not allocated in its member's capture" in str(m.message) for m in caught))

    def test_members_keep_no_buffer_alive(self):
        # A static KV cache made anew for each generate call: each call is a
        # member, and no member keeps an earlier cache alive.
        r, g, ops = self.runner(static=(0, 1))
        ops.arenas = 0x300  # addresses no other test's arena uses (the stand-in memory is shared)
        w = _Tensor((4,))
        gone = []
        for n in range(3):
            cache = _Tensor((16,), value=f"c{n}")
            out = r([w, cache, _Tensor((32,), value=f"x{n}")])
            self.assertEqual(out[0].value, ("f", f"c{n}", f"x{n}"))
            gone.append(weakref.ref(cache))
            del cache, out
        gc.collect()
        self.assertEqual([c() for c in gone], [None] * 3, "no cache kept alive by a member")
        # Each new cache of the same shape takes the member whose cache is
        # gone: captured once more on its plan, no new member, no eager run.
        self.assertEqual(len(r.members), 1)
        fam = ops.families[-1]
        self.assertEqual(fam.recaptured, [0, 0])
        self.assertEqual((r.report()["captures"], r.report()["plain_calls"]), (3, 0))
        # A capture of the whole family again drops the members whose
        # buffers are gone and captures the live ones.
        cache = _Tensor((16,), value="c3")
        r([w, cache, _Tensor((64,), value="y")])  # a larger shape: the family is captured anew
        self.assertEqual(len(r.members), 1)
        self.assertEqual(r([w, cache, _Tensor((64,), value="z")])[0].value, ("f", "c3", "z"))

    def test_members_whose_buffers_are_gone_make_room(self):
        ops = _FakeOps()
        ops.arenas = 0x400  # addresses no other test's arena uses (the stand-in memory is shared)
        r = apc._Runner(_Graph(ops), "graph0", static_idxs=[0, 1], reason=None,
                        opts=apc.CompileOptions(None, {"warmup": 0, "max_shapes": 2}), ops=ops, device=0)
        w = _Tensor((4,))
        kept = _Tensor((16,), value="k")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "more than max_shapes" fallback
            r([w, kept, _Tensor((32,), value="x")])  # a member whose cache lives on
            for n in range(5):
                cache = _Tensor((16,), value=f"c{n}")
                out = r([w, cache, _Tensor((32,), value=f"x{n}")])
                self.assertEqual(out[0].value, ("f", f"c{n}", f"x{n}"), f"call {n}")
                del cache, out
                gc.collect()
            self.assertEqual(r([w, kept, _Tensor((32,), value="y")])[0].value, ("f", "k", "y"),
                             "the live member kept through the captures anew")
        rep = r.report()
        self.assertEqual((rep["plain_calls"], rep["replays"]), (0, 7))
        self.assertLessEqual(rep["members"], 2)
        # Every cache alive: the limit holds (one warning, calls without a graph).
        caches = [_Tensor((16,), value=f"d{n}") for n in range(3)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for c in caches:
                self.assertEqual(r([w, c, _Tensor((32,), value="z")])[0].value, ("f", c.value, "z"))
        self.assertTrue(any("max_shapes" in str(m.message) for m in caught))

    def test_inputs_reach_the_graph_every_call(self):
        r, g, ops = self.runner()
        w = _Tensor((4,))
        for k in range(4):
            out = r([w, _Tensor((32,), value=f"x{k}")])
            self.assertEqual(out[0].value, ("f", f"x{k}"))
        fam = ops.families[0]
        self.assertEqual(fam.replays, [0, 0, 0, 0])
        self.assertEqual([v for cap, v in g.seen], [("x0",), ("x0",), ("garbage",)],
                         "filled from the input before the capture, not in it")
        self.assertEqual(g.freed, [True] * 3, "the step holds no reference once inductor's code emptied its list")
        self.assertNoneHeld(ops)
        m = next(iter(r.members.values()))
        self.assertEqual([x() if isinstance(x, weakref.ref) else x for x in m.args], [w, None])
        self.assertEqual(m.dst[0][2:], (fam.base, fam.base + 32))
        rep = r.report()
        self.assertEqual((rep["input_bytes_planned"], rep["input_bytes_outside"]), (32, 0))

    def test_last_capture_gives_the_address(self):
        r, g, ops = self.runner(captures=2)
        w = _Tensor((4,))
        out = r([w, _Tensor((32,), value="a")])
        fam = ops.families[0]
        self.assertNotEqual(fam.last_base, fam.base)
        m = next(iter(r.members.values()))
        self.assertEqual(m.addrs[1], fam.last_base)
        self.assertEqual(out[0].value, ("f", "a"))
        self.assertEqual(r([w, _Tensor((32,), value="b")])[0].value, ("f", "b"))

    def test_output_fed_back_at_the_same_address(self):
        r, g, ops = self.runner(out_offset=0)  # out = f(x) planned where x was
        w = _Tensor((4,))
        x = r([w, _Tensor((32,), value="x")])[0]
        n = len(ops.copies)
        for _ in range(3):
            x = r([w, x])[0]
        self.assertEqual(len(ops.copies), n, "already at its address: no copy")
        self.assertEqual(x.value, ("f", ("f", ("f", ("f", "x")))))

    def test_output_fed_back_overlapping_the_address(self):
        r, g, ops = self.runner(out_offset=8)  # out overlaps x's address, shifted
        w = _Tensor((4,))
        x = r([w, _Tensor((32,), value="x")])[0]
        for _ in range(3):
            x = r([w, x])[0]
        self.assertEqual(x.value, ("f", ("f", ("f", ("f", "x")))))
        self.assertNoneHeld(ops)

    def test_output_fed_back_where_another_input_goes(self):
        # Inputs a at [base, base+32) and b at [base+32, base+64); the output
        # at a's address: fed back as b, the copy of a would overwrite it
        # before it is read.
        r, g, ops = self.runner(out_offset=0)
        w = _Tensor((4,))
        out = r([w, _Tensor((32,), value="a0"), _Tensor((32,), value="b0")])[0]
        self.assertEqual(out.value, ("f", "a0", "b0"))
        out = r([w, _Tensor((32,), value="a1"), out])[0]
        self.assertEqual(out.value, ("f", "a1", ("f", "a0", "b0")))

    def test_smaller_shape_joins_the_family(self):
        # A smaller shape after a larger one fits in the family's arena:
        # one more capture, the first member's graph and addresses kept.
        r, g, ops = self.runner()
        w = _Tensor((4,))
        for k in range(3):
            self.assertEqual(r([w, _Tensor((32,), value=f"a{k}")])[0].value, ("f", f"a{k}"))
        g.seen.clear()
        dst = r.members[next(iter(r.members))].dst[0][2]
        self.assertEqual(r([w, _Tensor((16,), value="b0")])[0].value, ("f", "b0"))
        self.assertEqual(len(ops.families), 1)
        self.assertEqual([v for cap, v in g.seen if not cap], [("b0",), ("b0",)], "only the new member ran")
        fam = ops.families[0]
        for k in range(3):
            self.assertEqual(r([w, _Tensor((32,), value=f"a{k + 3}")])[0].value, ("f", f"a{k + 3}"))
            self.assertEqual(r([w, _Tensor((16,), value=f"b{k + 1}")])[0].value, ("f", f"b{k + 1}"))
        self.assertEqual(fam.replays, [0, 0, 0, 1] + [0, 1] * 3)
        self.assertEqual([m.dst[0][2] for m in r.members.values()], [dst, fam.base])
        rep = r.report()
        self.assertEqual((rep["family_builds"], rep["captures"], rep["input_bytes_planned"]), (1, 2, 48))
        self.assertNoneHeld(ops)

    def test_larger_shape_rebuilds_with_each_members_values(self):
        # A larger shape does not fit: every member is captured again,
        # largest first, the earlier one from its host copy.
        r, g, ops = self.runner()
        w = _Tensor((4,))
        for k in range(3):
            self.assertEqual(r([w, _Tensor((16,), value=f"a{k}")])[0].value, ("f", f"a{k}"))
        g.seen.clear()
        self.assertEqual(r([w, _Tensor((32,), value="b0")])[0].value, ("f", "b0"))
        self.assertEqual(len(ops.families), 2)
        self.assertTrue(ops.families[0].closed)
        before = [v for cap, v in g.seen if not cap]
        self.assertEqual(before, [("b0",), ("b0",), ("b0",), ("b0",), ("a0",), ("a0",)],
                         "the new member from its input (its try to join, then the family), the first from "
                         "its host copy")
        fam = ops.families[1]
        for k in range(3):
            self.assertEqual(r([w, _Tensor((16,), value=f"a{k + 3}")])[0].value, ("f", f"a{k + 3}"))
            self.assertEqual(r([w, _Tensor((32,), value=f"b{k + 1}")])[0].value, ("f", f"b{k + 1}"))
        self.assertEqual(fam.replays, [1] + [0, 1] * 3)
        for m in r.members.values():
            self.assertEqual(m.dst[0][2], fam.base, "the new family's addresses")
        self.assertEqual(r.report()["input_bytes_planned"], 48)
        self.assertNoneHeld(ops)

    def test_parameters_elsewhere(self):
        r, g, ops = self.runner()
        w, v = _Tensor((4,)), _Tensor((4,))
        self.assertEqual(r([w, _Tensor((32,), value="a")])[0].value, ("f", "a"))
        self.assertEqual(r([v, _Tensor((32,), value="b")])[0].value, ("f", "b"))
        self.assertEqual(len(ops.families), 1)
        self.assertEqual(r([w, _Tensor((32,), value="c")])[0].value, ("f", "c"))
        self.assertEqual(r([v, _Tensor((32,), value="d")])[0].value, ("f", "d"))
        self.assertEqual(ops.families[0].replays, [0, 1, 0, 1])

    def test_paused_arena_is_not_written(self):
        r, g, ops = self.runner()
        w = _Tensor((4,))
        r([w, _Tensor((32,), value="a")])
        fam = ops.families[0]
        fam.paused = True
        n = len(ops.copies)
        with self.assertRaisesRegex(RuntimeError, "paused"):
            r([w, _Tensor((32,), value="b")])
        self.assertEqual(len(ops.copies), n)
        fam.paused = False
        self.assertEqual(r([w, _Tensor((32,), value="c")])[0].value, ("f", "c"))

    def test_torch_without_tensors_at_addresses_gives_up(self):
        r, g, ops = self.runner()
        ops.can_make_outputs = lambda: False
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                out = r([_Tensor((4,)), _Tensor((32,), value="a")])
        self.assertEqual(len(w), 1)
        self.assertIn("_construct_storage_from_data_pointer", str(w[0].message))
        self.assertEqual((ops.families, out[0].value), ([], ("f", "a")))

    def test_empty_input(self):
        r, g, ops = self.runner()
        w = _Tensor((4,))
        r([w, _Tensor((0,))])
        r([w, _Tensor((0,))])
        m = next(iter(r.members.values()))
        self.assertEqual(m.dst, [])


class FramesTest(unittest.TestCase):
    """Graphs of different frames called one after another on one device
    (a graph break's two sides, compiled modules in sequence): one arena
    where nothing crosses from one to the next, arenas of their own where
    the next reads the last one's output or the program holds it."""

    def pair(self, **options):
        ops = _FakeOps()
        ops.arenas = 0x600  # addresses no other test's arena uses (the stand-in memory is shared)
        opts = apc.CompileOptions(None, dict({"warmup": 0}, **options))
        # Both outputs at one offset: a replay of either overwrites the other's.
        ga, gb = _Graph(ops), _Graph(ops)
        ra = apc._Runner(ga, "graph0", [0], None, opts, ops, 0, frame=11)
        rb = apc._Runner(gb, "graph1", [0], None, opts, ops, 0, frame=12)
        ws = (_Tensor((4,)), _Tensor((4,)))
        return ra, rb, ops, opts, ws

    def test_independent_graphs_of_two_frames_share_one_arena(self):
        ra, rb, ops, opts, (wa, wb) = self.pair()
        for k in range(4):
            # Each output read, then dropped before the other graph runs.
            self.assertEqual(ra([wa, _Tensor((32,), value=f"a{k}")])[0].value, ("f", f"a{k}"))
            self.assertEqual(rb([wb, _Tensor((16,), value=f"b{k}")])[0].value, ("f", f"b{k}"))
        self.assertEqual(len(ops.families), 1, "the second frame's graph joins the first one's arena")
        fam = ops.families[0]
        self.assertEqual(fam.keys, [0, 1])
        self.assertEqual(fam.size, 32, "the arena is the larger need, not the sum")
        self.assertIs(ra.group, rb.group)
        self.assertEqual(fam.replays, [0, 1] * 4, "every call replays (captured at the first)")
        self.assertEqual((ra.plain_calls, rb.plain_calls), (0, 0))
        self.assertEqual(rb.report()["shares_arena_with"], "graph0")
        # A later graph of the second frame (a recompilation) is in the same
        # group; a larger one captures the family anew, largest first.
        rc = apc._Runner(_Graph(ops), "graph2", [0], None, opts, ops, 0, frame=12)
        self.assertEqual(rc([wb, _Tensor((64,), value="c")])[0].value, ("f", "c"))
        self.assertIs(rc.group, ra.group)
        self.assertTrue(fam.closed)
        self.assertEqual(ops.families[-1].keys, [2, 0, 1])
        self.assertEqual(ops.families[-1].size, 64)
        for k in range(2):
            self.assertEqual(ra([wa, _Tensor((32,), value=f"a{k}")])[0].value, ("f", f"a{k}"))
            self.assertEqual(rb([wb, _Tensor((16,), value=f"b{k}")])[0].value, ("f", f"b{k}"))
        self.assertEqual(len(ops.families), 2)

    def test_share_frames_off_keeps_arenas_apart(self):
        self.assertTrue(apc.CompileOptions().share_frames)
        ra, rb, ops, opts, (wa, wb) = self.pair(share_frames=False)
        self.assertEqual(opts.inductor, {}, "share_frames is the backend's, not an inductor patch")
        for k in range(3):
            self.assertEqual(ra([wa, _Tensor((32,), value=f"a{k}")])[0].value, ("f", f"a{k}"))
            self.assertEqual(rb([wb, _Tensor((16,), value=f"b{k}")])[0].value, ("f", f"b{k}"))
        self.assertEqual([f.size for f in ops.families], [32, 16])
        self.assertIsNot(ra.group, rb.group)

    def test_a_graph_reading_the_last_output_shares_the_arena_around_it(self):
        # head(body(x)): the second graph takes the first one's output,
        # which the caller holds while it runs. It joins the first one's
        # arena, planned around that output: it reads it where it lies,
        # nothing moves out, and the arena grew in place (one family, never
        # captured anew).
        ra, rb, ops, _, (wa, wb) = self.pair()
        addrs = set()
        for k in range(4):
            h = ra([wa, _Tensor((32,), value=f"a{k}")])[0]
            addrs.add(h.ptr)
            self.assertEqual(rb([wb, h])[0].value, ("f", ("f", f"a{k}")), "as the uncaptured run")
            self.assertEqual(h.value, ("f", f"a{k}"), "the first output intact after the second graph ran")
            self.assertFalse(getattr(h, "denied", False))
            self.assertEqual(ops.copies[-1][1], h.ptr, "copied in from where it lies")
            del h
        self.assertEqual(len(ops.families), 1, "one arena for both graphs")
        self.assertIs(ra.group, rb.group)
        fam = ops.families[0]
        self.assertFalse(fam.closed, "never captured anew")
        self.assertEqual(fam.grown, 1, "grown in place for the second graph")
        self.assertEqual(len(addrs), 1, "the first graph's output stays in the arena, at one address")
        (p,) = addrs
        self.assertEqual(fam.around[1], [(p, p + 32)], "planned around the output it reads")
        self.assertEqual((ra.plain_calls, rb.plain_calls), (0, 0))
        self.assertEqual(fam.replays, [0, 1] * 4)
        self.assertEqual(rb.report()["outputs_moved_out"], 0, "no output moved out of the arena")
        # The calls in another order: the second graph's output held across
        # the first one's replay (a loop keeping it), which was not planned
        # around it, moves out first, value intact; the first one's output
        # held across the second's stays where it is, read in place.
        y = rb([wb, _Tensor((32,), value="b")])[0]
        h = ra([wa, _Tensor((32,), value="a9")])[0]
        self.assertEqual(y.value, ("f", "b"))
        self.assertFalse(getattr(y, "denied", False))
        self.assertEqual(ra.report()["outputs_moved_out"], 1)
        self.assertEqual(rb([wb, _Tensor((32,), value="c")])[0].value, ("f", "c"))
        self.assertEqual((h.ptr, h.value), (p, ("f", "a9")), "left alone by the graph planned around it")
        self.assertEqual(ra.report()["outputs_moved_out"], 1)
        self.assertEqual(len(ops.families), 1)

    def test_a_loop_plans_the_first_graph_again_around_the_output_it_keeps(self):
        # x = head(body(x)) in a loop: the body's graph was captured first,
        # planned around nothing, and its replay finds the head's output
        # (its input) held in the arena: it moves it out (one copy). At the
        # next step it would move the same range again: it is planned again
        # around it, its output where it was (the head's plan avoids it),
        # and captured once more; no copy after that, values as uncaptured.
        # The head's output lies where the body's input was planned: that
        # input goes elsewhere, and replays copy it there.
        ra, _, ops, opts, (wa, wb) = self.pair()
        rb = apc._Runner(_Graph(ops, out_offset=0), "graph1", [0], None, opts, ops, 0, frame=12)
        x, want, moved, at, dst = _Tensor((32,), value="x"), "x", [], set(), []
        for k in range(6):
            h = ra([wa, x])[0]
            at.add(h.ptr)
            dst.append(ops.copies[-1][0])  # where the body's input went
            x = rb([wb, h])[0]
            del h
            want = ("f", ("f", want))
            self.assertEqual(x.value, want, "as the uncaptured run")
            moved.append(ra.report()["outputs_moved_out"])
        self.assertNotEqual(dst[1], dst[2], "the body's input planned elsewhere")
        self.assertEqual(len(set(dst[2:])), 1)
        self.assertFalse(x.ptr < dst[2] + 32 and dst[2] < x.ptr + 32, "away from the head's output")
        fam = ops.families[0]
        self.assertEqual(len(ops.families), 1)
        self.assertFalse(fam.closed, "never captured anew")
        self.assertEqual(moved, [0, 1, 1, 1, 1, 1], "one copy, then none")
        self.assertEqual(fam.replanned, [0], "the first graph only, once")
        self.assertEqual((ra.captures, rb.captures), (2, 1))
        self.assertEqual(fam.around[0], [(x.ptr, x.ptr + 32)], "planned around the output the loop keeps")
        self.assertEqual(len(at), 1, "its output where it was")
        self.assertEqual(fam.replays, [0, 1] * 6)
        self.assertEqual((ra.plain_calls, rb.plain_calls), (0, 0))

    def test_a_refused_plan_leaves_the_graph_as_it_was(self):
        # The same loop, every plan made again refused (the member captured
        # again as it was): the output keeps moving out, values intact, and
        # the graph stops asking after two refusals.
        ra, rb, ops, _, (wa, wb) = self.pair()
        x, want, moved = _Tensor((32,), value="x"), "x", []
        for k in range(6):
            h = ra([wa, x])[0]
            ops.families[0].refuse = True
            x = rb([wb, h])[0]
            del h
            want = ("f", ("f", want))
            self.assertEqual(x.value, want, "as the uncaptured run")
            moved.append(ra.report()["outputs_moved_out"])
        fam = ops.families[0]
        self.assertEqual(moved, [0, 1, 2, 3, 4, 5], "a copy per step, as without the plan")
        self.assertEqual(fam.replanned, [0, 0])
        self.assertEqual((ra.captures, len(ops.families), ra.plain_calls), (3, 1, 0))
        self.assertNotIn(0, fam.around)

    def test_an_order_that_keeps_changing_plans_a_graph_again_at_most_twice(self):
        # The program keeps the output of another graph across the first
        # graph's replay, a different graph every three steps: the first
        # graph is planned again around the first two (after two replays
        # that moved the same range), then no more; the third's output
        # keeps moving out, intact, and the first one's again stays.
        ops = _FakeOps()
        ops.arenas = 0x700  # addresses no other test's arena uses
        opts = apc.CompileOptions(None, {"warmup": 0})
        ra = apc._Runner(_Graph(ops), "graph0", [0], None, opts, ops, 0, frame=21)
        others = [apc._Runner(_Graph(ops, out_offset=off), f"graph{j + 1}", [0], None, opts, ops, 0, frame=22 + j)
                  for j, off in enumerate((0x200, 0x300, 0x400))]
        wa, w = _Tensor((16,)), _Tensor((16,))
        self.assertEqual(ra([wa, _Tensor((16,), value="a")])[0].value, ("f", "a"))
        moved = []
        for k in range(12):
            kept = others[(k // 3) % 3]([w, _Tensor((16,), value=f"g{k}")])[0]
            self.assertEqual(ra([wa, _Tensor((16,), value=f"a{k}")])[0].value, ("f", f"a{k}"))
            self.assertEqual(kept.value, ("f", f"g{k}"), "kept across the first graph's replay, intact")
            self.assertFalse(getattr(kept, "denied", False))
            del kept
            moved.append(ra.report()["outputs_moved_out"])
        fam = ops.families[0]
        self.assertEqual(fam.replanned, [0, 0], "at most twice")
        self.assertEqual(ra.captures, 3)
        self.assertEqual(moved, [1, 1, 1, 2, 2, 2, 3, 4, 5, 5, 5, 5])
        self.assertEqual(len(ops.families), 1)

    def test_share_frames_off_keeps_a_reading_graph_apart(self):
        ra, rb, ops, _, (wa, wb) = self.pair(share_frames=False)
        for k in range(2):
            h = ra([wa, _Tensor((32,), value=f"a{k}")])[0]
            self.assertEqual(rb([wb, h])[0].value, ("f", ("f", f"a{k}")))
            del h
        self.assertEqual(len(ops.families), 2)
        self.assertIsNot(ra.group, rb.group)

    def test_an_input_in_the_last_outputs_memory_is_planned_around(self):
        # An input over the memory of an output of the family (not the
        # output's tensor, so nothing counts it as held): the graph that
        # reads it joins, planned around that memory.
        ra, rb, ops, _, (wa, wb) = self.pair()
        p = ra([wa, _Tensor((32,), value="a")])[0].ptr
        out = _Tensor((32,), ptr=p)
        self.assertEqual(rb([wb, out])[0].value, ("f", ("f", "a")))
        self.assertEqual(out.value, ("f", "a"))
        self.assertIs(ra.group, rb.group)
        self.assertEqual(len(ops.families), 1)
        self.assertEqual(ops.families[0].around[1], [(p, p + 32)])

    def test_an_output_held_across_the_other_frames_replay_moves_out(self):
        ra, rb, ops, _, (wa, wb) = self.pair()
        ra([wa, _Tensor((32,), value="a0")])
        rb([wb, _Tensor((16,), value="b0")])
        self.assertIs(ra.group, rb.group)
        # Later the program keeps the first graph's output past the
        # second's replay (the order of calls learned no longer holds):
        # it moves out of the arena first, value intact.
        a = ra([wa, _Tensor((32,), value="a1")])
        inside = a[0].ptr
        self.assertEqual(rb([wb, _Tensor((16,), value="b1")])[0].value, ("f", "b1"))
        self.assertNotEqual(a[0].ptr, inside, "moved out before the other graph's replay")
        self.assertEqual(a[0].value, ("f", "a1"))
        self.assertFalse(getattr(a[0], "denied", False))
        # And the other way round: the second graph's output held across
        # the first one's replay.
        b = rb([wb, _Tensor((16,), value="b2")])
        self.assertEqual(ra([wa, _Tensor((32,), value="a2")])[0].value, ("f", "a2"))
        self.assertEqual(b[0].value, ("f", "b2"))
        del a, b
        # A view held: it cannot move, so the other graph runs without a
        # graph until it goes, and nothing it reads is overwritten.
        a = ra([wa, _Tensor((32,), value="a3")])
        a[0].storage.views = 1
        plain = rb.plain_calls
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(rb([wb, _Tensor((16,), value="b3")])[0].value, ("f", "b3"))
        self.assertIn("a view of an output", str(caught[0].message))
        self.assertEqual(rb.plain_calls, plain + 1)
        self.assertEqual(a[0].value, ("f", "a3"))
        a[0].storage.views = 0
        del a
        self.assertEqual(rb([wb, _Tensor((16,), value="b4")])[0].value, ("f", "b4"))
        self.assertEqual(rb.plain_calls, plain + 1, "replays resume once the view is gone")
        self.assertEqual(len(ops.families), 1)

    def test_a_parameter_in_the_arena_is_not_captured(self):
        # The first graph's output kept as the second one's buffer (read in
        # place, by address) after both joined one arena: a member captured
        # with it would read it where the replays write. It runs without a
        # graph, and reads the value the first graph left.
        ra, rb, ops, _, (wa, wb) = self.pair()
        ra([wa, _Tensor((32,), value="a0")])
        rb([wb, _Tensor((16,), value="b0")])
        self.assertIs(ra.group, rb.group)
        state = ra([wa, _Tensor((32,), value="a1")])[0]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(rb([state, _Tensor((16,), value="b1")])[0].value, ("f", "b1"))
        self.assertIn("a parameter or buffer lies in the memory", str(caught[0].message))
        self.assertEqual(rb.plain_calls, 1)
        self.assertEqual(len(ops.families), 1)
        self.assertEqual(state.value, ("f", "a1"))

    def test_a_graph_first_captured_on_another_thread_keeps_its_own_arena(self):
        import threading
        ra, rb, ops, _, (wa, wb) = self.pair()
        ra([wa, _Tensor((32,), value="a0")])
        got = []
        t = threading.Thread(target=lambda: got.append(rb([wb, _Tensor((16,), value="b0")])[0].value))
        t.start()
        t.join()
        self.assertEqual(got, [("f", "b0")])
        self.assertIsNot(ra.group, rb.group)
        self.assertEqual(len(ops.families), 2)


class _Node:
    def __init__(self, op, name, target=None, args=()):
        self.op, self.name, self.target, self.args, self.kwargs, self.meta = op, name, target, args, {}, {}


def _op(name, writes_first, returns_view=False):
    arg = lambda n, w: types.SimpleNamespace(name=n, alias_info=types.SimpleNamespace(is_write=w))  # noqa: E731
    ret = types.SimpleNamespace(alias_info=types.SimpleNamespace(is_write=False) if returns_view else None)
    schema = types.SimpleNamespace(arguments=[arg("self", writes_first), arg("src", False)], returns=[ret])
    return types.SimpleNamespace(_schema=schema, __name__=name)


class MutationTest(unittest.TestCase):
    def test_written_inputs_through_views(self):
        p = [_Node("placeholder", f"arg{i}") for i in range(3)]
        view = _Node("call_function", "view", _op("view", False, returns_view=True), (p[2],))
        nodes = p + [_Node("call_function", "add", _op("add", False), (p[0], p[1])),
                     _Node("call_function", "copy_", _op("copy_", True), (p[1], p[0])),
                     view, _Node("call_function", "copy_1", _op("copy_", True), (view, p[0]))]
        gm = types.SimpleNamespace(graph=types.SimpleNamespace(nodes=nodes))
        self.assertEqual(apc._mutated_inputs(gm, p), {1, 2})


class _Storage:
    pass


class _TrainOps(_FakeOps):
    """Stand-ins for a training pair: tensors own a storage whose weak
    reference expires when the last tensor over it goes."""

    def __init__(self):
        super().__init__()
        self.chains = []
        self.fail_capture = None

    @staticmethod
    def meta(t):
        return (t.ptr, t.shape)

    @staticmethod
    def is_scalar(t):
        return t.shape == ()

    @staticmethod
    def storage_id(t):
        return id(t.storage)

    @staticmethod
    def zero(t):
        t.value = 0

    @staticmethod
    def grad(x):
        return getattr(x, "grad", None)


    def capture_chain(self, stages, name, device, opts, capture=None):
        """One recording pass over every stage, then a capture of each of
        the first ``capture``; ch.capture(fn) captures the next."""
        ch = types.SimpleNamespace(outputs=[], replays=[], closed=False, handed=None, recorded=[])
        box = None
        for fn in stages:  # the recording pass
            out = fn(box)
            ch.recorded.append(out)
            box = [out]
        del box

        ch.kernels = []

        def capture_next(fn):
            if self.fail_capture:
                raise RuntimeError(self.fail_capture)
            self.capturing_now, self.kernels = True, []
            try:
                out = fn(ch.handed)
            finally:
                self.capturing_now = False
            ch.kernels.append(self.kernels)
            ch.outputs.append(out)
            ch.handed = [out] if len(ch.outputs) < len(stages) else None
            return out
        for fn in stages[:capture or len(stages)]:
            capture_next(fn)
        ch.capture = capture_next
        def replay(i):
            ch.replays.append(i)
            for k in ch.kernels[i]:
                k()
        ch.replay = replay
        ch.report = lambda: {"arena": 10, "lower_bound": 10, "capture_ms": {0: 1.0, 1: 1.0}}
        ch.close = lambda: setattr(ch, "closed", True)
        self.chains.append(ch)
        return ch

    @staticmethod
    def output(o):
        t = _Tensor(o.shape, o.device, o.ptr)
        t.storage = _Storage()
        return t


def _tensor(shape, ptr=None):
    t = _Tensor(shape, ptr=ptr)
    t.storage = _Storage()
    return t


class _Fw:
    """A training forward: (loss, a saved activation), new each call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, args):
        args.clear()
        self.calls += 1
        return [_tensor(()), _tensor((64,))]


class _Bw:
    """Its backward: (saved activation, incoming gradient) -> a gradient."""

    def __init__(self):
        self.calls = 0

    def __call__(self, args):
        args.clear()
        self.calls += 1
        return [_tensor((16,))]


class _Stateful:
    """A graph that writes its first input in place (a running statistic,
    an optimizer's moment: one more each run) and draws a random number
    (the stand-in generator advances); under a capture it records a kernel
    that does both at each replay. Returns (loss, a saved activation)."""

    def __init__(self, ops):
        self.ops, self.calls = ops, 0

    def __call__(self, args):
        ops, buf = self.ops, args[0]
        args.clear()
        self.calls += 1

        def kernel():
            buf.value = buf.value + 1
            ops.rng += 1
        if ops.capturing_now:
            ops.kernels.append(kernel)
        else:
            kernel()
        return [_tensor(()), _tensor((64,))]


class NoFillTest(unittest.TestCase):
    def test_new_memory_left_unfilled_inside_the_block_only(self):
        # torch.use_deterministic_algorithms(True) fills new memory; a fill
        # captured in a step would overwrite the input copied there.
        det = types.SimpleNamespace(fill_uninitialized_memory=True)
        saved = getattr(apc.torch, "utils", None)
        apc.torch.utils = types.SimpleNamespace(deterministic=det)
        try:
            with apc._no_fill():
                self.assertFalse(det.fill_uninitialized_memory)
            self.assertTrue(det.fill_uninitialized_memory)
            with self.assertRaises(KeyError):
                with apc._no_fill():
                    raise KeyError("x")
            self.assertTrue(det.fill_uninitialized_memory, "restored when the block raises")
        finally:
            if saved is None:
                del apc.torch.utils
            else:
                apc.torch.utils = saved


class EffectsTest(unittest.TestCase):
    """The runs a capture makes before it (warm-up, recording) change
    nothing the program sees: a graph that writes a buffer and draws random
    numbers leaves them as if each call had run once."""

    def test_inference_graph(self):
        ops = _FakeOps()
        g = _Stateful(ops)
        opts = apc.CompileOptions(None, {"warmup": 1})
        r = apc._Runner(g, "graph0", static_idxs=[0], reason=None, opts=opts, ops=ops, device=0, mutated=[0])
        buf = _tensor((8,))
        buf.value = 0
        for n in range(1, 5):
            r([buf, _tensor((4,))])
            self.assertEqual((buf.value, ops.rng), (n, n), f"after {n} calls")
        self.assertEqual(r.report()["replays"], 3)
        self.assertEqual(g.calls, 4, "one plain call, two runs before the capture, one captured")

    def test_graphs_of_one_frame_captured_anew(self):
        # The frame's second graph does not fit the first one's arena: the
        # family is captured anew with both, and the first graph's runs in
        # that capture leave its buffer as it was.
        ops = _FakeOps()
        opts = apc.CompileOptions(None, {"warmup": 0})
        ra = apc._Runner(_Stateful(ops), "graph0", [0], None, opts, ops, 0, mutated=[0], frame=3)
        rb = apc._Runner(_Stateful(ops), "graph1", [0], None, opts, ops, 0, mutated=[0], frame=3)
        a, b = _tensor((8,)), _tensor((8,))
        a.value = b.value = 0
        ra([a, _tensor((4,))])
        rb([b, _tensor((64,))])
        self.assertEqual(len(ops.families), 2)
        self.assertTrue(ops.families[0].closed)
        self.assertEqual(sorted(ops.families[1].keys), [0, 1], "both graphs' members")
        self.assertEqual((a.value, b.value, ops.rng), (1, 1, 2), "one run each, as the program called them")
        ra([a, _tensor((4,))])
        self.assertEqual((a.value, b.value, ops.rng), (2, 1, 3))

    def test_training_forward(self):
        ops = _TrainOps()
        opts = apc.CompileOptions(None, {})
        pair = apc._TrainPair("graph0", opts, ops)
        fw = apc._Runner(_Stateful(ops), "graph0", [0], None, opts, ops, 0, mutated=[0])
        bw = apc._Runner(_Bw(), "graph0-bw", [0], None, opts, ops, 0)
        fw.pair = bw.pair = pair
        pair.fw, pair.bw = fw, bw
        buf = _tensor((16,))
        buf.value = 0
        for n in range(1, 5):
            outs = fw([buf, _tensor((4,))])
            bw([outs[1], _tensor(())])
            del outs
            self.assertEqual((buf.value, ops.rng), (n, n), f"after {n} steps")
        self.assertEqual(pair.replays["forward"], 3)

    def test_failed_capture_undoes_its_runs(self):
        ops = _FakeOps()
        g = _Stateful(ops)

        def capture(fns, name, device, opts):
            for fn in fns.values():
                fn()  # a warm-up run, then the capture fails
            raise RuntimeError("capture failed")
        ops.capture = capture
        r = apc._Runner(g, "graph0", static_idxs=[0], reason=None, opts=apc.CompileOptions(None, {"warmup": 0}),
                        ops=ops, device=0, mutated=[0])
        buf = _tensor((8,))
        buf.value = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r([buf, _tensor((4,))])
        self.assertEqual((buf.value, ops.rng), (1, 1), "the call ran once, without a graph")
        self.assertEqual(r.report()["plain_calls"], 1)


class TrainPairTest(unittest.TestCase):
    def setUp(self):
        self.ops = _TrainOps()
        opts = apc.CompileOptions(None, {})
        self.fw_inner, self.bw_inner = _Fw(), _Bw()
        self.pair = apc._TrainPair("graph0", opts, self.ops)
        self.fw = apc._Runner(self.fw_inner, "graph0", [0], None, opts, self.ops, 0)
        self.bw = apc._Runner(self.bw_inner, "graph0-bw", [0], None, opts, self.ops, 0)
        self.fw.pair = self.bw.pair = self.pair
        self.pair.fw, self.pair.bw = self.fw, self.bw
        self.weight, self.x = _tensor((16,)), _tensor((4,))

    def forward(self):
        return self.fw([self.weight, self.x])

    def backward(self, outs):
        return self.bw([outs[1], _tensor(())])

    def step(self):
        outs = self.forward()
        grads = self.backward(outs)
        return outs, grads

    def test_captured_after_one_plain_step_then_replayed(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.step()  # plain: shows which backward input is the saved activation
            self.assertIsNone(self.ops.chains[0] if self.ops.chains else None)
            for _ in range(3):
                self.step()
        ch = self.ops.chains[0]
        self.assertEqual(ch.replays, [0, 1] * 3)
        # Inductor's code ran for the plain step, the recording pass and
        # once per stage in its capture.
        self.assertEqual((self.fw_inner.calls, self.bw_inner.calls), (3, 3))
        # The plain forward and backward ran each in a pool of its own, released when it returned,
        # on the capture stream with their threads' workspaces there, their outputs marked as used
        # on the program's stream.
        self.assertEqual((self.ops.routed, [p.closed for p in self.ops.pools]), ([0, 1], [True, True]))
        self.assertEqual(len(self.ops.stream_blocks), 2)
        self.assertEqual(len(self.ops.used), 3, "the forward's two outputs and the backward's gradient")
        self.assertEqual(self.pair.bw_map[0], ("fw", 1))
        self.assertEqual(self.pair.bw_map[1][0], "tan")
        r = self.fw.report()
        self.assertTrue(r["captured"])
        self.assertEqual((r["replays"], r["plain_calls"]), (3, 1))

    def test_forward_before_the_pending_backward_runs_plain(self):
        self.step()
        self.step()  # captured
        held = self.forward()  # its backward has not run: its saved activation is in use
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            other = self.forward()
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0])
        self.assertEqual(self.fw_inner.calls, 4)  # plain, recorded, captured, plain
        self.assertTrue(any("wait for their backward" in str(m.message) for m in w))
        self.backward(other)  # the plain forward's backward: not the arena's activation, plain too
        self.assertEqual(self.bw_inner.calls, 4)
        self.backward(held)  # the pending one replays
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])

    def test_held_gradients_are_moved_out_of_the_arena(self):
        self.step()
        _, grads = self.step()  # captured; its gradients kept (as .grad after accumulation)
        g = grads[0]
        arena_ptr = g.ptr
        g.value = "accumulated"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, again = self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1], "the chain replays: no call without a graph")
        self.assertNotEqual(g.ptr, arena_ptr, "the held gradient left the arena before the replay")
        self.assertEqual(g.value, "accumulated", "with its value")
        self.assertEqual(again[0].ptr, arena_ptr, "the replay's gradient is at the arena's address")
        self.assertEqual(self.pair.grads_moved, 1)
        m = next(iter(self.pair.members.values()))
        self.assertFalse(m.bw_out.cached, "gradients kept across calls: no longer cached outputs")
        self.assertNotIn(id(again[0]), self.ops.cached,
                         "from now on the backward's outputs are not cached outputs: AccumulateGrad copies them")
        del grads, again
        self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1] * 3)
        self.assertEqual(self.pair.grads_moved, 1, "gradients released before the step are not moved")

    def test_gradient_kept_as_an_alias_is_found_through_the_parameter(self):
        # AccumulateGrad keeps a detached alias of the gradient (another
        # tensor over the same memory), not the tensor the backward returned.
        self.step()
        _, grads = self.step()
        alias = _Tensor(grads[0].shape, ptr=grads[0].ptr)
        alias.storage = grads[0].storage
        alias.value = "accumulated"
        self.weight.grad = alias
        arena_ptr = alias.ptr
        kept = grads[0]  # the returned tensor still alive beside the alias: both move, together
        del grads
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])
        self.assertNotEqual(self.weight.grad.ptr, arena_ptr)
        self.assertEqual(self.weight.grad.value, "accumulated")
        self.assertEqual(kept.ptr, self.weight.grad.ptr)

    def test_gradients_at_one_address_move_each_with_its_storage(self):
        # Two outputs of the backward over the same memory (views of one
        # buffer): each has a storage of its own, and each is moved with
        # the tensors over that storage.
        def bw(args):
            args.clear()
            g = _tensor((16,))
            h = _Tensor((16,), ptr=g.ptr)
            h.storage = _Storage()
            return [g, h]
        self.bw.inner = bw
        self.step()
        _, grads = self.step()
        arena_ptr = grads[0].ptr
        self.assertEqual(grads[1].ptr, arena_ptr)
        a = _Tensor((16,), ptr=arena_ptr)  # AccumulateGrad's alias of the first
        a.storage = grads[0].storage
        self.weight.grad = a
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])
        self.assertNotEqual(a.ptr, arena_ptr)
        self.assertEqual(a.ptr, grads[0].ptr, "moved together with the tensor over its storage")
        self.assertNotEqual(grads[1].ptr, arena_ptr)

    def test_held_gradient_with_a_view_means_plain_calls(self):
        self.step()
        _, grads = self.step()
        grads[0].storage.views = 1  # another tensor shares its memory: it cannot be moved
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1])
        self.assertTrue(any("gradients are still held" in str(m.message) for m in w))
        del grads
        self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])

    def test_outputs_reused_while_nothing_holds_them(self):
        self.step()
        self.step()  # captured
        made = self.ops.view_calls
        ids = None
        for _ in range(3):
            outs, grads = self.step()
            now = ([id(t) for t in outs], [id(t) for t in grads])
            self.assertTrue(ids is None or now == ids, "the same tensors from replay to replay")
            ids = now
            self.assertIn(id(grads[0]), self.ops.cached, "gradients registered as cached outputs")
            del outs, grads
        self.assertEqual(self.ops.view_calls, made, "made once, at the first replay")
        kept = self.forward()[0]  # the program keeps the loss
        self.backward([None, self.pair.members[next(iter(self.pair.members))].fw_out.current(1)])
        loss = self.forward()[0]
        self.assertIsNot(loss, kept, "a held output is replaced by a new tensor")
        self.assertTrue(getattr(kept, "denied", False), "and the held one raises when read")

    def test_backward_of_an_overwritten_forward_raises(self):
        self.step()
        outs, grads = self.step()  # captured; outs kept, as retain_graph=True keeps the saved activations
        del grads
        self.forward()  # its backward ran, so this replay may overwrite them
        with self.assertRaisesRegex(RuntimeError, "overwritten by a later replay"):
            self.backward(outs)

    def test_input_from_another_captured_graph_is_read_in_place(self):
        self.step()
        outs, _ = self.step()  # this pair captured: its outputs are at fixed addresses
        opts = apc.CompileOptions(None, {})
        fw2 = apc._Runner(_Fw(), "graph1", [], None, opts, self.ops, 0)
        bw2 = apc._Runner(_Bw(), "graph1-bw", [], None, opts, self.ops, 0)
        pair2 = apc._TrainPair("graph1", opts, self.ops)
        fw2.pair = bw2.pair = pair2
        pair2.fw, pair2.bw = fw2, bw2
        copies = []
        self.ops.copy = lambda dst, src: copies.append(src.ptr)
        for _ in range(3):
            outs, _ = self.step()
            o2 = fw2([outs[0]])  # the first graph's output, as a loss graph takes the logits
            bw2([o2[1], _tensor(())])
        self.assertEqual(len(self.ops.chains), 2)
        self.assertIn(outs[0].ptr, [a.ptr for a in next(iter(pair2.members.values())).fw_args])
        self.assertNotIn(outs[0].ptr, copies)  # never copied into a placeholder
        self.assertEqual(self.ops.chains[1].replays, [0, 1, 0, 1])  # plain once, then captured
        self.pair.close()
        self.assertNotIn(outs[0].ptr, apc._fixed_outputs)
        pair2.close()

    def test_optimizer_step_reads_the_gradients_in_place(self):
        # A compiled optimizer step (a graph without a backward) after the
        # chain: the gradients its captured backward returned are read where
        # the backward wrote them, neither planned in the step's arena nor
        # copied there; a gradient elsewhere replays another member.
        ops = self.ops
        g = _Graph(ops)
        opt = apc._Runner(g, "graph1", static_idxs=[0], reason=None,
                          opts=apc.CompileOptions(None, {"warmup": 0}), ops=ops, device=0)
        w = _tensor((4,))
        _, grads = self.step()  # plain: the gradient is the plain backward's, not a graph's
        self.step()  # the chain captured
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for k in range(3):
                _, grads = self.step()
                grads[0].value = f"g{k}"
                self.assertEqual(opt([w, grads[0]])[0].value, ("f", f"g{k}"))
        r = opt.report()
        self.assertEqual((r["inputs_in_place"], r["input_bytes_planned"], r["captures"]), (1, 0, 1))
        m = next(iter(opt.members.values()))
        self.assertEqual((m.copy_idxs, m.ptrs[1]), ([], grads[0].ptr))
        self.assertNotIn(grads[0].ptr, [src for _, src in ops.copies])
        self.assertEqual(ops.families[-1].replays, [0, 0, 0])
        # The gradient somewhere else (the chain ran without a graph): not
        # the address the capture read, so that capture is not replayed; the
        # member, whose gradient is gone, is captured once more on its plan
        # with this one (as for parameters made anew).
        fam = ops.families[-1]
        other = _tensor((16,))
        other.value = "elsewhere"
        self.assertEqual(opt([w, other])[0].value, ("f", "elsewhere"))
        self.assertEqual((len(opt.members), fam.recaptured, opt.report()["captures"]), (1, [0], 2))
        self.assertEqual(next(iter(opt.members.values())).ptrs[1], other.ptr)
        self.pair.close()

    def test_optimizer_step_follows_a_gradient_moved_out(self):
        # zero_grad(set_to_none=False): the gradient the optimizer step was
        # captured reading in place is kept across the next step, so the
        # chain moves it out of its arena; the step then reads it where it
        # went, never the arena's address, which the replay wrote again.
        ops = self.ops
        opt = apc._Runner(_Graph(ops), "graph1", static_idxs=[0], reason=None,
                          opts=apc.CompileOptions(None, {"warmup": 0}), ops=ops, device=0)
        w = _tensor((4,))
        self.step()
        _, grads = self.step()  # the chain captured
        g = grads[0]
        g.value = "g1"
        self.assertEqual(opt([w, g])[0].value, ("f", "g1"))
        arena_ptr = g.ptr
        del grads
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, again = self.step()  # g held: moved out first
            self.assertNotEqual(g.ptr, arena_ptr)
            again[0].value = "the replay's"
            for k in range(3):
                g.value = f"g{k + 2}"  # AccumulateGrad adds into the kept gradient
                self.assertEqual(opt([w, g])[0].value, ("f", f"g{k + 2}"))
        self.assertEqual(opt.report()["captures"], 2, "one capture more, at the gradient's new address")
        self.pair.close()

    def _loss_pair(self, name="graph1"):
        """A loss graph: reads the model's first output; its backward makes
        the model's incoming gradient (the logits' gradient)."""
        opts = apc.CompileOptions(None, {})

        def loss_bw(args):
            args.clear()
            return [_tensor(())]
        fw2 = apc._Runner(_Fw(), name, [], None, opts, self.ops, 0)
        bw2 = apc._Runner(loss_bw, name + "-bw", [], None, opts, self.ops, 0)
        pair2 = apc._TrainPair(name, opts, self.ops)
        fw2.pair = bw2.pair = pair2
        pair2.fw, pair2.bw = fw2, bw2
        return fw2, bw2, pair2

    def test_incoming_gradient_from_another_graph_is_read_in_place(self):
        fw2, bw2, pair2 = self._loss_pair()

        def train_step():
            outs = self.forward()
            o2 = fw2([outs[0]])
            g2 = bw2([o2[1], _tensor(())])  # the loss's gradient: autograd's ones
            return outs, self.bw([outs[1], g2[0]]), g2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            train_step()  # plain: learned
            train_step()  # captured: each backward at its first call
            outs, grads, g2 = train_step()
        del grads  # as zero_grad(set_to_none=True) lets them go
        m = next(iter(self.pair.members.values()))
        self.assertEqual(m.tangent_inplace, {1: g2[0].ptr})  # read where the loss graph's backward wrote it
        self.assertEqual(m.tangents, {})  # no placeholder
        self.assertNotIn(g2[0].ptr, [src for _, src in self.ops.copies])
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])
        r = self.bw.report()
        self.assertEqual((r["incoming_in_place"], r["input_bytes_outside"]), (1, 4))  # 4: the forward's input x
        m2 = next(iter(pair2.members.values()))
        self.assertEqual(list(m2.tangents), [1])  # autograd's ones are copied into a placeholder
        self.assertEqual(pair2.bw.report()["incoming_in_place"], 0)
        # The gradient somewhere else (its graph ran without one): plain, one warning.
        calls = self.bw_inner.calls
        outs = self.forward()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.bw([outs[1], _tensor(())])
        self.assertEqual(self.bw_inner.calls, calls + 1)
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1, 0])
        self.assertTrue(any("not where the backward's capture read it" in str(x.message) for x in w))
        self.pair.close()
        pair2.close()

    def test_failed_backward_capture_runs_without_a_graph(self):
        self.step()  # plain: learned
        outs = self.forward()  # the forward captured and replayed
        self.ops.fail_capture = "out of memory"
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            grads = self.backward(outs)
        self.assertEqual(len(grads), 1)
        self.assertIn("capture of the backward failed", self.pair.reason)
        self.assertTrue(any("out of memory" in str(x.message) for x in w))
        self.assertEqual(self.fw.report()["input_bytes_outside"], 4)  # the forward's input only
        ch = self.ops.chains[0]
        self.assertFalse(ch.closed)  # the forward's outputs the program holds stay valid
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.step()
        self.assertEqual(ch.replays, [0])  # everything after runs without a graph
        self.pair.close()
        self.assertTrue(ch.closed)

    def test_each_shape_its_own_chain(self):
        x2 = _tensor((2,))
        for _ in range(3):
            self.step()  # shape (4,): plain, then captured
        for _ in range(3):  # a last, partial batch: plain once, then its own chain
            outs = self.fw([self.weight, x2])
            self.bw([outs[1], _tensor(())])
        self.assertEqual(len(self.ops.chains), 2)
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])
        self.assertEqual(self.ops.chains[1].replays, [0, 1, 0, 1])
        self.step()  # back to the first shape: its chain
        self.assertEqual(self.ops.chains[0].replays, [0, 1] * 3)
        r = self.fw.report()
        self.assertEqual((r["members"], r["arena"], r["lower_bound"]), (2, 20, 20))
        # max_shapes bounds the chains: a third shape with max_shapes=2 runs plain.
        self.pair.opts.max_shapes = 2
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                outs = self.fw([self.weight, _tensor((3,))])
                self.bw([outs[1], _tensor(())])
        self.assertEqual(len(self.ops.chains), 2)
        self.assertTrue(any("max_shapes=2" in str(m.message) for m in w))

    def test_dynamic_graph_backward_gets_each_shapes_sizes(self):
        # A graph compiled with a symbolic batch: the batch is an input of
        # the forward and of the backward; each shape's chain must capture
        # its backward with that shape's size, not the first learned one's.
        opts = apc.CompileOptions(None, {})
        seen = []

        def fw_inner(args):
            n, x = args[1], args[2]
            args.clear()
            assert x.shape == (n,), (x.shape, n)
            return [_tensor((n,))]

        def bw_inner(args):
            g, n = args[0], args[1]
            args.clear()
            assert g.shape == (n,), ("expected size", g.shape, n)
            seen.append(n)
            return [_tensor((n,))]
        fw = apc._Runner(fw_inner, "graph3", [0], None, opts, self.ops, 0)
        bw = apc._Runner(bw_inner, "graph3-bw", [], None, opts, self.ops, 0)
        pair = apc._TrainPair("graph3", opts, self.ops)
        fw.pair = bw.pair = pair
        pair.fw, pair.bw = fw, bw
        for n in (2, 4):  # the partial batch first (plain), then the full one (plain)
            out = fw([self.weight, n, _tensor((n,))])
            bw([_tensor(out[0].shape), n])
        for n in (4, 2):  # each captured with its own sizes
            out = fw([self.weight, n, _tensor((n,))])
            bw([_tensor(out[0].shape), n])
        self.assertIsNone(pair.reason)
        self.assertEqual(len(self.ops.chains), 2)
        self.assertEqual(seen, [2, 4, 4, 4, 2, 2])  # plain twice, then each shape recorded and captured

    def test_learns_only_from_a_backward_of_the_last_plain_forward(self):
        first = self.forward()  # plain
        self.forward()  # plain again, before the first one's backward
        self.backward(first)  # its saved activation is not the last plain forward's: nothing learned
        self.assertIsNone(self.pair.bw_map)
        self.step()  # a forward and its own backward: learned
        self.assertEqual(self.pair.bw_map[0], ("fw", 1))
        self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1])

    def test_backward_without_saved_activations_picks_its_shape(self):
        opts = apc.CompileOptions(None, {})

        def fw_inner(args):
            x = args[1]
            args.clear()
            return [_tensor(x.shape)]

        def bw_inner(args):
            g = args[0]
            args.clear()
            return [_tensor(g.shape)]
        fw = apc._Runner(fw_inner, "graph2", [0], None, opts, self.ops, 0)
        bw = apc._Runner(bw_inner, "graph2-bw", [], None, opts, self.ops, 0)
        pair = apc._TrainPair("graph2", opts, self.ops)
        fw.pair = bw.pair = pair
        pair.fw, pair.bw = fw, bw
        for shape in ((4,), (2,)):
            for _ in range(2):  # plain, then captured
                out = fw([self.weight, _tensor(shape)])
                bw([_tensor(out[0].shape)])
        self.assertEqual(len(self.ops.chains), 2)
        out = fw([self.weight, _tensor((2,))])
        bw([_tensor((2,))])  # no saved activation tells the shapes apart: the gradient's shape does
        self.assertEqual(self.ops.chains[1].replays, [0, 1, 0, 1])
        self.assertEqual(self.ops.chains[0].replays, [0, 1])
        pair.close()


if __name__ == "__main__":
    unittest.main()
