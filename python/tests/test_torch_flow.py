"""arenaplan.torch's control flow (warm-up, recording, planning, serving,
capturing, replanning, families) over libarenaplan.so on the simulated
device, with a stand-in for the few torch.cuda calls it makes: no GPU, no
torch. The stand-in's "capture" only marks that a capture is underway (the
step's allocations while it is are what the step does under capture); the
library's own capture handling is tested in Go (bridge.TestCaptureOnSim).
"""
import contextlib
import os
import sys
import tempfile
import threading
import types
import unittest

os.environ["ARENAPLAN_DEVICE"] = "sim"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


class _Stream:
    _next = 0x5000

    def __init__(self, device=0):
        _Stream._next += 1
        self.cuda_stream, self.device = _Stream._next, device

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


class _Graph:
    captures = 0

    def __init__(self, keep_graph=False):
        self.alive = False

    def reset(self):
        self.alive = False

    def replay(self):
        if not self.alive:
            raise RuntimeError("replay of a reset graph")


_state = types.SimpleNamespace(stream=_Stream(), capturing=False, generator=None)


@contextlib.contextmanager
def _stream_ctx(s):
    old, _state.stream = _state.stream, s
    try:
        yield
    finally:
        _state.stream = old


@contextlib.contextmanager
def _graph_ctx(g, stream=None, pool=None, capture_error_mode="global"):
    _Graph.captures += 1
    with _stream_ctx(stream or _state.stream):
        if _state.generator is None:
            # CUDAGraph.capture_begin: the default generator's seed and
            # offset for graphs, made in the process's first capture, on
            # the capture stream, kept for good.
            h = _state.stream.cuda_stream
            _state.generator = [LIB.alloc(8, 0, h), LIB.alloc(8, 0, h)]
        _state.capturing = True
        try:
            yield
        finally:
            _state.capturing = False
    g.alive = True


class _Tensor:
    """A tensor, as far as its dtype and size go."""

    def __init__(self, dtype="float32", numel=1):
        self.dtype, self._numel = dtype, numel

    def numel(self):
        return self._numel

    def __getitem__(self, i):
        return self


class _Pool:
    """arenaplan's torch.cuda.MemPool, as far as routing goes, and whether
    it was made for graph memory (laid out beside the small arenas)."""

    def __init__(self, allocator=None, *args, _graph_memory=False, **kwargs):
        self.graph_memory = _graph_memory


_Pool.__module__ = "arenaplan._mempool"
_routed = threading.local()


@contextlib.contextmanager
def _use_pool(pool, device=None):
    old, _routed.pool = getattr(_routed, "pool", None), pool
    try:
        yield
    finally:
        _routed.pool = old


torch = types.ModuleType("torch")
torch.Tensor = _Tensor
# Matrix products: the streams, threads and pools they ran on and in
# (PyTorch keeps a cuBLAS workspace per handle, one per thread, and
# stream, allocated where the thread's allocations go).
_products: list = []


def _product(name, dtype=None):
    _products.append((name, _state.stream.cuda_stream, threading.get_ident(), getattr(_routed, "pool", None), dtype))


torch.device = lambda kind, index=None: (kind, index)
torch.float16, torch.bfloat16, torch.float32, torch.int64 = "float16", "bfloat16", "float32", "int64"
torch.ones = lambda *shape, device=None, dtype="float32": _Tensor(dtype, 64)
torch.addmm = lambda bias, a, b: _product("addmm", a.dtype)
# Dropping PyTorch's workspaces: noted among the products, in order.
torch._C = types.SimpleNamespace(_cuda_clearCublasWorkspaces=lambda: _products.append(("clear",)))
torch.cuda = types.SimpleNamespace(
    Stream=_Stream, CUDAGraph=_Graph, current_device=lambda: 0,
    current_stream=lambda device=None: _state.stream, stream=_stream_ctx, graph=_graph_ctx,
    synchronize=lambda device=None: None, empty_cache=lambda: _products.append(("empty",)), MemPool=_Pool,
    use_mem_pool=_use_pool, current_blas_handle=lambda: _product("handle"))


def _leaves(x):
    return [y for v in x for y in _leaves(v)] if isinstance(x, (list, tuple)) else [x]


torch.utils = types.SimpleNamespace(_pytree=types.SimpleNamespace(tree_map=lambda f, x: f(x), tree_leaves=_leaves))
sys.modules.setdefault("torch", torch)
sys.modules.setdefault("torch.utils", torch.utils)
sys.modules.setdefault("torch.utils._pytree", torch.utils._pytree)

import arenaplan.torch as ap  # noqa: E402
from arenaplan import _family, _state as ap_state  # noqa: E402
from arenaplan._lib import Library  # noqa: E402

if sys.modules["torch"] is not torch:
    raise unittest.SkipTest("a real torch is importable here: these tests use a stand-in")

LIB = Library()
ap_state.lib = LIB
LIB.step_join_capture = lambda sid: None  # the stand-in captures nothing


def _weak(out):
    """A view of a step's outputs that does not own their memory."""
    if isinstance(out, (list, tuple)):
        return type(out)(_weak(o) for o in out)
    return types.SimpleNamespace(ptr=out.ptr) if isinstance(out, _Out) else out


_family._weak = _weak


class _Out:
    """A step's output: its memory is freed when the last reference goes,
    as a tensor's is."""

    def __init__(self, ptr, stream):
        self.ptr, self.stream = ptr, stream

    def __del__(self):
        LIB.free(self.ptr, 0, 0, self.stream)


def model(scale=1, capture_extra=0):
    """A step: activations freed two layers later, a workspace per layer,
    one output (an address) returned. Under capture its layer 3 is
    capture_extra bytes larger, as code that tests capture status does."""
    def fn():
        h = _state.stream.cuda_stream
        acts = []
        for i in range(6):
            size = (4096 + 1000 * i) * scale + (capture_extra if _state.capturing and i == 3 else 0)
            acts.append(LIB.alloc(size, 0, h))
            ws = LIB.alloc(65536, 0, h)
            LIB.free(ws, 65536, 0, h)
            if len(acts) > 2:
                LIB.free(acts.pop(0))
        out = _Out(LIB.alloc(8192 * scale, 0, h), h)
        for a in acts:
            LIB.free(a)
        return out
    return fn


class GraphFlowTest(unittest.TestCase):
    def test_one_capture_when_eager_and_capture_agree(self):
        _state.generator = None  # this test's capture is the process's first
        n = _Graph.captures
        g = ap.graph(model(), warmup=2)
        r = g.report()
        self.assertEqual(_Graph.captures - n, 1)
        self.assertEqual((r["captures"], r["replans"], r["divergences"]), (1, 0, 0))
        self.assertEqual(r["arena"], r["lower_bound"])
        g.replay()
        g.close()

    def test_capture_that_differs_is_replanned(self):
        n = _Graph.captures
        g = ap.graph(model(capture_extra=512), warmup=2)
        r = g.report()
        self.assertEqual(_Graph.captures - n, 2)
        self.assertEqual((r["captures"], r["replans"], r["divergences"], r["last_run_divergences"]), (2, 1, 0, 0))
        self.assertEqual(r["arena"], r["lower_bound"])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "g.plan")
            g.save(path)
            n = _Graph.captures
            g2 = ap.graph(model(capture_extra=512), plan=path)
            r2 = g2.report()
            self.assertEqual(_Graph.captures - n, 1)
            self.assertEqual((r2["captures"], r2["divergences"], r2["arena"]), (1, 0, r["arena"]))
            g2.close()
        g.close()

    def test_record_under_capture(self):
        n = _Graph.captures
        g = ap.graph(model(capture_extra=512), record="capture")
        r = g.report()
        self.assertEqual(_Graph.captures - n, 2)
        self.assertEqual((r["captures"], r["replans"], r["divergences"]), (2, 0, 0))
        g.close()
        with self.assertRaises(ap.ArenaplanError):
            ap.graph(model(), record="sometimes")
        with self.assertRaises(ap.ArenaplanError):
            ap.graph(model(), record="eager", warmup=0)

    def test_family_replans_only_the_member_that_differs(self):
        fns = {4: model(scale=4), 2: model(scale=2, capture_extra=512), 1: model(scale=1)}
        n = _Graph.captures
        fam = ap.graphs(fns)
        r = fam.report()
        self.assertEqual(_Graph.captures - n, 4)
        self.assertEqual(fam.captures, {4: 1, 2: 2, 1: 1})
        self.assertEqual([m["replans"] for m in r["members"]], [0, 1, 0])
        self.assertEqual(sum(m["divergences"] for m in r["members"]), 0)
        self.assertEqual(r["arena"], r["lower_bound"])
        # Where the start-up went: each member's warm-up and recording.
        self.assertEqual((set(r["warmup_ms"]), set(r["record_ms"])), (set(fns), set(fns)))
        self.assertGreaterEqual(r["setup_ms"], 0)
        for k in (1, 4, 2, 2, 1):
            fam.replay(k)
        fam.close()

    def test_family_members_are_planned_while_the_next_ones_record(self):
        # Each member's plan starts right after its recording, with the
        # family's budget, so that family_plan finds it made.
        lib, calls = ap_state.need(), []
        ahead, plan = lib.family_plan_ahead, lib.family_plan
        lib.family_plan_ahead = lambda fid, sid, b: (calls.append(("ahead", b)), ahead(fid, sid, b))[1]
        lib.family_plan = lambda fid, b: (calls.append(("plan", b)), plan(fid, b))[1]
        try:
            fam = ap.graphs({4: model(scale=4), 2: model(scale=2), 1: model(scale=1)}, budget=0.5)
        finally:
            del lib.family_plan_ahead, lib.family_plan
        self.assertEqual(calls, [("ahead", 0.5)] * 3 + [("plan", 0.5)])
        self.assertEqual(sum(m["divergences"] for m in fam.report()["members"]), 0)
        fam.close()

    def test_family_grows_without_recapturing_its_members(self):
        # A smaller member joins the family's arena: one recording and one
        # capture, the others' graphs and outputs untouched, the arena as
        # large as before. A larger one does not fit: it is refused and the
        # family is as it was.
        fam = ap.graphs({4: model(scale=4), 2: model(scale=2)})
        arena, n = fam.report()["arena"], _Graph.captures
        outs = dict(fam.outputs)
        fam.add(1, model(scale=1))
        r = fam.report()
        self.assertEqual(_Graph.captures - n, 1)
        self.assertEqual((r["arena"], len(r["members"])), (arena, 3))
        self.assertEqual(sum(m["divergences"] for m in r["members"]), 0)
        self.assertEqual({k: fam.outputs[k].ptr for k in (4, 2)}, {k: o.ptr for k, o in outs.items()})
        with self.assertRaises(ap.ArenaplanError) as e:
            fam.add(8, model(scale=8))
        self.assertIn("does not fit", str(e.exception))
        self.assertEqual(fam.keys, [4, 2, 1])
        self.assertEqual(len(fam.report()["members"]), 3)
        with self.assertRaises(ValueError):
            fam.add("1", model())  # the name of member 1
        with self.assertRaises(ValueError):
            fam.add(1, model())
        for k in (1, 4, 2, 1):
            fam.replay(k)
        fam.close()

    def test_chain_captures_a_later_stage_when_asked(self):
        # A forward whose output its backward frees; the backward captured
        # later (as at its first call): served from the one plan with no
        # divergence. A stage not captured yet does not replay.
        def fw(_box):
            h = _state.stream.cuda_stream
            tmp = LIB.alloc(4096, 0, h)
            out = _Out(LIB.alloc(8192, 0, h), h)
            LIB.free(tmp)
            return out

        def bw(box):
            h = _state.stream.cuda_stream
            act = box.pop()
            grad = _Out(LIB.alloc(8192, 0, h), h)
            del act  # the backward frees the forward's activation
            return grad
        with self.assertRaises(ValueError):
            ap.chain([fw, bw], capture=3)
        st = _Stream()
        ch = ap.chain([fw, bw], stream=st, capture=1)
        self.assertEqual(ch.captured, 1)
        ch.replay(0)
        with self.assertRaisesRegex(ap.ArenaplanError, "not captured yet"):
            ch.replay(1)
        # Another chain made and replayed in between, as a loss graph is.
        other = ap.chain([fw, bw], stream=_Stream())
        other.replay(0)
        other.replay(1)
        # Captured in another thread (a backward, in autograd's): that
        # thread's workspaces on the chain's stream are made first.
        n = _Graph.captures
        del _products[:]
        errs: list = []

        def later():
            try:
                ch.capture(bw)
                me = threading.get_ident()
                errs.append([p[:3] for p in _products] == [("clear",), ("handle", st.cuda_stream, me),
                                                           ("addmm", st.cuda_stream, me)])
            except BaseException as e:  # noqa: BLE001 - reported below
                errs.append(e)
        th = threading.Thread(target=later)
        th.start()
        th.join()
        self.assertEqual(errs, [True])
        self.assertEqual((ch.captured, _Graph.captures - n), (2, 1))
        r = ch.report()
        self.assertEqual(sum(m["divergences"] for m in r["members"]), 0)
        self.assertEqual(r["arena"], r["lower_bound"])
        ch.replay(0)
        ch.replay(1)
        with self.assertRaisesRegex(ap.ArenaplanError, "no stage left"):
            ch.capture(bw)
        ch.close()
        other.close()
        # Closed with a stage still to capture: the outputs handed to it go first.
        ch = ap.chain([fw, bw], stream=_Stream(), capture=1)
        ch.close()
        with self.assertRaisesRegex(ap.ArenaplanError, "closed chain"):
            ch.capture(bw)

        # A stage that raises in a warm-up pass: its own error, the chain undone.
        def broken(box):
            raise KeyError("stage")
        with self.assertRaises(KeyError):
            ap.chain([fw, broken], stream=_Stream())

    def test_workspaces_dropped_by_another_thread_are_made_again_in_their_pool(self):
        # Making one thread's workspaces drops every thread's (PyTorch
        # clears them all): the other thread makes its own again, in the
        # stream's pool, before it multiplies on the stream, and not twice.
        from arenaplan import _graph
        st = _Stream()
        me = threading.get_ident()
        del _products[:]
        _graph.ensure_workspaces(st, 0)
        _graph.ensure_workspaces(st, 0)
        made = [p[:3] for p in _products]
        self.assertEqual(made, [("clear",), ("handle", st.cuda_stream, me), ("addmm", st.cuda_stream, me)])
        other = []
        th = threading.Thread(target=lambda: (_graph.ensure_workspaces(st, 0), other.append(threading.get_ident())))
        th.start()
        th.join()
        self.assertEqual([p[:3] for p in _products[3:]],
                         [("clear",), ("handle", st.cuda_stream, other[0]), ("addmm", st.cuda_stream, other[0])])
        del _products[:]
        _graph.ensure_workspaces(st, 0)
        self.assertEqual([p[:3] for p in _products], made, "this thread's, dropped by the other's, made again")
        self.assertTrue(all(isinstance(p[3], _Pool) for p in _products if p[0] != "clear"), "in the stream's pool")
        self.assertTrue(all(p[3].graph_memory for p in _products if p[0] != "clear"),
                        "the stream's pool is one for graph memory")
        # Another stream's are its own.
        st2 = _Stream()
        del _products[:]
        _graph.ensure_workspaces(st2, 0)
        self.assertEqual([p[:2] for p in _products], [("clear",), ("handle", st2.cuda_stream), ("addmm", st2.cuda_stream)])

    def test_capture_streams_have_their_workspaces_first(self):
        # cuBLAS and cuBLASLt make a workspace per stream at its first
        # matrix product: each capture stream has had one of each before
        # anything is captured on it, made after PyTorch's workspaces are
        # dropped (so that threads capturing on one stream take turns on
        # one workspace's memory) in the stream's own pool, never released
        # (so that dropping them frees that memory only to later
        # workspaces of the stream). A graph's or a family's first step
        # warms up between the two: its cuBLASLt workspace is made after
        # it, in the dtype of its outputs.
        from arenaplan import _graph
        pools = {}

        def runs(f):
            def step(*_box):
                _products.append(("run",))
                return f()
            return step
        for kind, make in (("graphs", lambda st: ap.graphs({1: runs(model())}, stream=st)),
                           ("chain", lambda st: ap.chain([runs(model())], stream=st)),
                           ("graph", lambda st: ap.graph(runs(model()), stream=st))):
            for st in (_Stream(), _Stream()):
                _graph._lt_dtype = None
                del _products[:]
                n = _Graph.captures
                g = make(st)
                me = threading.get_ident()
                ps = [p[:3] for p in _products]
                if kind == "chain":
                    # Then the cache goes back, before the runs of the capture
                    # (the stand-in's torch.cuda.graph empties nothing).
                    self.assertEqual(ps[:4], [("clear",), ("handle", st.cuda_stream, me),
                                              ("addmm", st.cuda_stream, me), ("empty",)])
                    rest, made = _products[4:], _products[1:3]
                else:
                    k = ps.index(("clear",), 1)  # after the warm-up runs
                    self.assertEqual(ps[:3], [("clear",), ("handle", st.cuda_stream, me), ("empty",)])
                    self.assertEqual(set(ps[3:k]), {("run",)})
                    self.assertEqual(ps[k:k + 3], [("clear",), ("handle", st.cuda_stream, me), ("addmm", st.cuda_stream, me)])
                    rest, made = _products[k + 3:], _products[k + 1:k + 3]
                    self.assertEqual(_products[k + 2][4], "float32", "no floating-point output: float32")
                self.assertEqual(set(rest), {("run",)}, "every later run of the step after them")
                self.assertGreaterEqual(len(rest), 2, "recording and capture runs")
                self.assertIsInstance(made[0][3], _Pool)
                self.assertIs(made[0][3], made[1][3])
                pools[st.cuda_stream] = made[0][3]
                self.assertGreater(_Graph.captures, n)
                g.close()
                # Again on the same stream: the same pool.
                del _products[:]
                g = make(st)
                self.assertIs(_products[1][3], pools[st.cuda_stream])
                g.close()
        self.assertEqual(len({id(p) for p in pools.values()}), len(pools), "a pool per stream")

    def test_cublaslt_workspace_is_made_in_the_outputs_dtype(self):
        # A product's first run in a dtype loads its kernels (tens of
        # milliseconds): the workspace's product runs in the dtype the
        # step's largest floating-point output has, and later workspaces
        # of the process in that dtype too.
        from arenaplan import _graph
        _graph._lt_dtype = None
        inner = model()

        def step():
            return inner(), [_Tensor("int64", 4096), _Tensor("bfloat16", 512), _Tensor("float32", 8)]
        for make in (lambda: ap.graphs({1: step, 2: step}, stream=_Stream()), lambda: ap.graph(step, stream=_Stream())):
            del _products[:]
            g = make()
            self.assertEqual([p[4] for p in _products if p[0] == "addmm"], ["bfloat16"])
            g.close()
        del _products[:]
        _graph.ensure_workspaces(_Stream(), 0)
        self.assertEqual([p[4] for p in _products if p[0] == "addmm"], ["bfloat16"], "the dtype learned")
        # With no warm-up run before the recorded one, no dtype is known yet.
        _graph._lt_dtype = None
        del _products[:]
        ap.graph(step, warmup=1, stream=_Stream()).close()
        self.assertEqual([p[4] for p in _products if p[0] == "addmm"], ["float32"])

    def test_replay_on_another_stream_waits_for_the_last(self):
        # A replay on another stream than the last one's waits for it
        # first (its memory is the same arena); on the same stream it does
        # not. With PyTorch's C call for the stream's identity and without.
        waits = []

        class S(_Stream):
            def wait_stream(self, other):
                waits.append((self.cuda_stream, other.cuda_stream))
        fam = ap.graphs({1: model()}, stream=_Stream())
        a, b = S(), S()
        for fast in (False, True):
            if fast:
                torch._C._cuda_getCurrentStream = lambda d: (_state.stream.cuda_stream, d, 1)
            try:
                del waits[:]
                fam._last_stream = fam._last_key = None
                for st in (a, a, b, b, a):
                    with _stream_ctx(st):
                        fam.replay(1)
                self.assertEqual(waits, [(b.cuda_stream, a.cuda_stream), (a.cuda_stream, b.cuda_stream)])
            finally:
                if fast:
                    del torch._C._cuda_getCurrentStream
        fam.close()

    def test_step_error_ends_the_run(self):
        def bad():
            LIB.alloc(4096, 0, _state.stream.cuda_stream)
            raise ValueError("model bug")
        st = _Stream()
        with self.assertRaises(ValueError):
            ap.graph(bad, warmup=1, stream=st)
        # The failed run was ended: its stream is free for another step (a
        # stream still taken by a step refuses the next one).
        g = ap.graph(model(), warmup=1, stream=st)
        g.close()


if __name__ == "__main__":
    unittest.main()
