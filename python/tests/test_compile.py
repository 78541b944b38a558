"""arenaplan.compile's logic without torch or a GPU: the backend's options,
its registration, and what a compiled graph's wrapper does call by call
(plain warm-up calls, one capture, replays that copy only the inputs that
are not parameters or buffers, members per shape and parameter address in
one family, the limit, give-ups with one warning, outputs of an earlier
call made unreadable), over a stand-in for torch and arenaplan.torch.
"""
import os
import sys
import types
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


class _Tensor:
    """A stand-in tensor: a shape, a device and an address."""
    _next = 0x1000

    def __init__(self, shape, device=("cuda", 0), ptr=None):
        self.shape, self.device = tuple(shape), device
        if ptr is None:
            _Tensor._next += 0x1000
            ptr = _Tensor._next
        self.ptr = ptr
        self.copied_from = []


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
    saved = {k: sys.modules.get(k) for k in list(mods) + ["arenaplan.compile"]}
    sys.modules.update(mods)
    sys.modules.pop("arenaplan.compile", None)
    try:
        import arenaplan.compile as apc
    finally:
        for k, v in saved.items():
            if k == "arenaplan.compile":
                continue
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return apc, registry


apc, REGISTRY = _import_compile()


class _Family:
    def __init__(self, fns, log):
        self.keys = list(fns)
        self.outputs = {}
        self.replays = []
        self.closed = False
        for k, fn in fns.items():
            out = fn()  # the capture runs the step once
            self.outputs[k] = out
        log.append(self)

    def replay(self, key):
        assert not self.closed
        self.replays.append(key)
        return self.outputs[key]

    def report(self):
        return {"arena": 1000, "lower_bound": 1000, "ratio": 1.0, "arena_mapped": 1024, "spill_held": 0,
                "graph_bytes": 1024, "capture_ms": {k: 1.0 for k in self.keys}}

    def close(self):
        self.closed = True


class _FakeOps(apc._Ops):
    """arenaplan.compile._Ops over stand-in tensors and families."""

    def __init__(self, fail=None):
        self.families, self.denied, self.fail = [], [], fail
        self.view_calls = 0

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

    @staticmethod
    def copy(dst, src):
        dst.copied_from.append(src.ptr)

    def capture(self, fns, name, device, opts):
        if self.fail:
            raise RuntimeError(self.fail)
        return _Family(fns, self.families)

    def views(self, outs):
        def make():
            self.view_calls += 1
            return [_Tensor(o.shape, o.device, o.ptr) for o in outs]
        return make

    def deny(self, outs):
        for o in outs:
            o.denied = True
            self.denied.append(o)


class _Inner:
    """Inductor's compiled graph: records the inputs of every call, empties
    the list (the boxed convention) and returns one output per call."""

    def __init__(self):
        self.calls = []

    def __call__(self, args):
        self.calls.append(list(args))
        args.clear()
        return (_Tensor((1,)),)


def _runner(reason=None, **options):
    inner, ops = _Inner(), _FakeOps(options.pop("fail", None))
    opts = apc.CompileOptions(None, options)
    r = apc._Runner(inner, "graph0", static_idxs=[0, 1], reason=reason, opts=opts, ops=ops, device=0)
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
    def test_warmup_capture_replay(self):
        r, inner, ops = _runner()
        w0, w1, x = _Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4))
        args = [w0, w1, x, 3]
        out0 = r(args)
        self.assertEqual(args, [], "the boxed convention: the list of inputs is emptied")
        self.assertEqual(len(inner.calls), 1)
        self.assertEqual(inner.calls[0], [w0, w1, x, 3], "the warm-up call runs inductor's code on the inputs")
        self.assertEqual(ops.families, [])
        out1 = r([w0, w1, x, 3])
        fam = ops.families[0]
        self.assertEqual(len(inner.calls), 2, "one capture run")
        cap = inner.calls[1]
        self.assertIs(cap[0], w0)
        self.assertIs(cap[1], w1)
        self.assertIsNot(cap[2], x, "a non-static input is captured in a placeholder")
        self.assertEqual(cap[3], 3)
        self.assertIn(x.ptr, cap[2].copied_from)
        self.assertEqual(fam.replays, [0])
        x2 = _Tensor((8, 4))
        out2 = r([w0, w1, x2, 3])
        self.assertEqual(len(inner.calls), 2, "replays run no Python of the step")
        self.assertEqual(cap[2].copied_from[-1], x2.ptr)
        self.assertEqual(fam.replays, [0, 0])
        self.assertFalse(getattr(out0[0], "denied", False), "a plain call's outputs are the caller's")
        self.assertTrue(out1[0].denied, "the previous replay's outputs are overwritten")
        self.assertFalse(getattr(out2[0], "denied", False))
        self.assertEqual(out1[0].ptr, out2[0].ptr, "outputs at fixed addresses")
        self.assertIsNot(out1[0], out2[0])
        # The placeholder itself as input: nothing to copy.
        n = len(cap[2].copied_from)
        r([w0, w1, cap[2], 3])
        self.assertEqual(len(cap[2].copied_from), n)
        rep = r.report()
        self.assertEqual((rep["captured"], rep["members"], rep["captures"], rep["replays"], rep["plain_calls"]),
                         (True, 1, 1, 3, 1))
        self.assertEqual((rep["static_inputs"], rep["other_inputs"], rep["placeholder_bytes"]), (2, 2, 32))
        self.assertEqual((rep["arena"], rep["lower_bound"], rep["graph_bytes"]), (1000, 1000, 1024))

    def test_parameters_elsewhere_make_another_member(self):
        r, inner, ops = _runner(warmup=0)
        w0, w1, x = _Tensor((4, 4)), _Tensor((4,)), _Tensor((8, 4))
        r([w0, w1, x, 3])
        v0 = _Tensor((4, 4))
        r([v0, w1, x, 3])
        self.assertEqual(len(ops.families), 2, "the family is captured again with both members")
        self.assertTrue(ops.families[0].closed)
        self.assertEqual(ops.families[1].replays, [1])
        r([w0, w1, x, 3])
        self.assertEqual(ops.families[1].replays, [1, 0])
        self.assertEqual(r.report()["members"], 2)

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


if __name__ == "__main__":
    unittest.main()


class _Storage:
    pass


class _TrainOps(_FakeOps):
    """Stand-ins for a training pair: tensors own a storage whose weak
    reference expires when the last tensor over it goes."""

    def __init__(self):
        super().__init__()
        self.chains = []

    @staticmethod
    def meta(t):
        return (t.ptr, t.shape)

    @staticmethod
    def is_scalar(t):
        return t.shape == ()

    @staticmethod
    def storage_ref(t):
        import weakref
        ref = weakref.ref(t.storage)
        return types.SimpleNamespace(expired=lambda: ref() is None)

    @staticmethod
    def storage_id(t):
        return id(t.storage)

    @staticmethod
    def zeros(t):
        return _Tensor(t.shape, t.device)

    def capture_chain(self, stages, name, device, opts):
        ch = types.SimpleNamespace(outputs=[], replays=[], closed=False)
        box = None
        for fn in stages:
            out = fn(box)
            ch.outputs.append(out)
            box = [out]
        ch.replay = lambda i: ch.replays.append(i)
        ch.report = lambda: {"arena": 10, "lower_bound": 10, "capture_ms": {0: 1.0, 1: 1.0}}
        ch.close = lambda: setattr(ch, "closed", True)
        self.chains.append(ch)
        return ch

    def views(self, outs):
        def make():
            res = []
            for o in outs:
                t = _Tensor(o.shape, o.device, o.ptr)
                t.storage = _Storage()
                res.append(t)
            return res
        return make


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
        # Inductor's code ran for the plain step and once per stage in the capture.
        self.assertEqual((self.fw_inner.calls, self.bw_inner.calls), (2, 2))
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
        self.assertEqual(self.fw_inner.calls, 3)
        self.assertTrue(any("wait for their backward" in str(m.message) for m in w))
        self.backward(other)  # the plain forward's backward: not the arena's activation, plain too
        self.assertEqual(self.bw_inner.calls, 3)
        self.backward(held)  # the pending one replays
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])

    def test_held_gradients_mean_plain_calls(self):
        self.step()
        _, grads = self.step()  # captured; its gradients kept (as .grad after accumulation)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1])
        self.assertTrue(any("gradients are still held" in str(m.message) for m in w))
        del grads
        self.step()
        self.assertEqual(self.ops.chains[0].replays, [0, 1, 0, 1])

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
