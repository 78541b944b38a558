"""The Python binding over libarenaplan.so on the simulated device (no GPU,
no torch). Run from the repository root after building the library:

    ARENAPLAN_LIB=build/libarenaplan.so python3 -m unittest discover -s python/tests
"""
import os
import sys
import tempfile
import unittest

os.environ["ARENAPLAN_DEVICE"] = "sim"  # read once, when the library loads
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from arenaplan._lib import ArenaplanError, Library, PlanMismatchError  # noqa: E402

LIB = Library()


def planned_pair(stream, name):
    """A family whose first member is recorded, planned and served once
    (its output kept), and a second member recorded after it. Returns
    (family, first, second, the served run's addresses, its output)."""
    fid = LIB.family_new(0, name)
    first = LIB.family_member(fid, "a")
    LIB.step_record(first, stream)
    _, out = run_step(stream)
    LIB.step_end(first)
    LIB.free(out)
    LIB.family_plan(fid, 1.0)
    LIB.step_serve(first, stream, True)
    addrs, held = run_step(stream)
    LIB.step_end(first)
    second = LIB.family_member(fid, "b")
    LIB.step_record(second, stream)
    _, out = run_step(stream, scale=3)
    LIB.step_end(second)
    LIB.free(out)
    return fid, first, second, addrs, held


def run_step(stream, layers=6, extra=0, scale=1):
    """A model-like step: activations freed two layers later, a workspace
    and a 0-byte request per layer, one output kept. Returns (addresses,
    output)."""
    addrs, acts = [], []
    for i in range(layers):
        size = (4096 + 1000 * i) * scale + (extra if i == 3 else 0)
        a = LIB.alloc(size, 0, stream)
        acts.append((a, size))
        ws = LIB.alloc(65536, 0, stream)
        z = LIB.alloc(0, 0, stream)
        addrs += [a, ws]
        LIB.free(ws, 65536, 0, stream)
        LIB.free(z, 0, 0, stream)
        if len(acts) > 2:
            LIB.free(*acts.pop(0), 0, stream)  # with its size, as torch frees: the memory stats count it
    out = LIB.alloc(8192, 0, stream)
    addrs.append(out)
    for a in acts:
        LIB.free(*a, 0, stream)
    return addrs, out


def planned_step(stream):
    sid = LIB.step_new(0, "py")
    LIB.step_record(sid, stream)
    _, out = run_step(stream)
    LIB.step_end(sid)
    LIB.free(out)
    LIB.step_plan(sid, 1.0)
    return sid


class LibraryTest(unittest.TestCase):
    def test_alloc_free_and_zero_bytes(self):
        a, b = LIB.alloc(1000), LIB.alloc(1000)
        self.assertTrue(a and b and a != b and a % 256 == 0)
        zs = [LIB.alloc(0) for _ in range(50)]
        self.assertEqual(len(set(zs)), 50)
        self.assertNotIn(0, zs)
        for p in [a, b] + zs:
            LIB.free(p)

    def test_out_of_memory_says_why(self):
        self.assertEqual(LIB.alloc(1 << 50), 0)
        self.assertIn("allocating 1125899906842624 bytes", LIB.last_error())

    def test_serve_same_addresses(self):
        stream = 0x201
        sid = planned_step(stream)
        runs = []
        for _ in range(3):
            LIB.step_serve(sid, stream, True)
            addrs, out = run_step(stream)
            LIB.step_end(sid)
            LIB.free(out)
            runs.append(addrs)
        self.assertEqual(runs[0], runs[1])
        self.assertEqual(runs[1], runs[2])
        r = LIB.step_report(sid)
        self.assertEqual((r["runs"], r["divergences"], r["arena"]), (3, 0, r["lower_bound"]))
        LIB.step_close(sid)

    def test_replan_from_a_diverged_run(self):
        # The plan is recorded from one run (eager); a run that allocates
        # differently (the capture) diverges; step_replan plans that run,
        # and the next runs follow the new plan exactly.
        stream = 0x203
        sid = planned_step(stream)
        with self.assertRaises(ArenaplanError):
            LIB.step_replan(sid, 1.0)  # no diverged run yet
        LIB.step_serve(sid, stream, False)
        _, out = run_step(stream, extra=512)
        LIB.step_end(sid)
        self.assertGreater(LIB.step_report(sid)["last_run_divergences"], 0)
        LIB.free(out)
        LIB.step_replan(sid, 1.0)
        runs = []
        for _ in range(2):
            LIB.step_serve(sid, stream, True)
            addrs, out = run_step(stream, extra=512)
            LIB.step_end(sid)
            LIB.free(out)
            runs.append(addrs)
        self.assertEqual(runs[0], runs[1])
        r = LIB.step_report(sid)
        self.assertEqual((r["replans"], r["divergences"], r["arena"]), (1, 0, r["lower_bound"]))
        self.assertIn("divergences", r["replan_reason"])
        LIB.step_close(sid)

    def test_plan_for_another_step_refused(self):
        stream = 0x202
        sid = planned_step(stream)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.plan")
            LIB.step_save(sid, path)
            other = LIB.step_new(0, "other")
            LIB.step_load(other, path)
            LIB.step_serve(other, stream, False)
            _, out = run_step(stream, layers=7)
            with self.assertRaises(PlanMismatchError) as cm:
                LIB.step_end(other)
            self.assertIn("another step", str(cm.exception))
            LIB.free(out)
            with self.assertRaises(ArenaplanError):
                LIB.step_load(LIB.step_new(0, "x"), os.path.join(d, "missing.plan"))
        LIB.step_close(sid)

    def test_errors_are_exceptions(self):
        with self.assertRaises(ArenaplanError) as cm:
            LIB.step_serve(424242, 0, False)
        self.assertIn("no step 424242", str(cm.exception))
        sid = LIB.step_new(0, "empty")
        with self.assertRaises(ArenaplanError):
            LIB.step_serve(sid, 0x203, False)  # no plan yet

    def test_stats(self):
        st = LIB.stats(0)
        self.assertGreater(st["Allocs"], 0)
        self.assertIn("Spill", st)


if __name__ == "__main__":
    unittest.main()


class FamilyAndSleepTest(unittest.TestCase):
    def test_family_members_planned_ahead(self):
        # Each member's plan starts as soon as it is recorded; the
        # family's plan takes them. Refused: a member not recorded yet,
        # one planned ahead already, a step of another family, any
        # member once the family is planned.
        stream = 0x5252
        fid = LIB.family_new(0, "ahead")
        other = LIB.family_new(0, "other")
        stranger = LIB.family_member(other, "x")
        sids = []
        for k in (4, 2, 1):
            sid = LIB.family_member(fid, f"bs{k}")
            with self.assertRaises(ArenaplanError):
                LIB.family_plan_ahead(fid, sid, 1.0)
            LIB.step_record(sid, stream)
            _, out = run_step(stream, scale=k)
            LIB.step_end(sid)
            LIB.free(out)
            LIB.family_plan_ahead(fid, sid, 1.0)
            with self.assertRaises(ArenaplanError):
                LIB.family_plan_ahead(fid, sid, 1.0)
            sids.append(sid)
        with self.assertRaises(ArenaplanError):
            LIB.family_plan_ahead(fid, stranger, 1.0)
        LIB.family_plan(fid, 1.0)
        with self.assertRaises(ArenaplanError):
            LIB.family_plan_ahead(fid, sids[0], 1.0)
        r = LIB.family_report(fid)
        self.assertEqual([m["name"] for m in r["members"]], ["bs4", "bs2", "bs1"])
        self.assertGreaterEqual(r["arena"], r["lower_bound"])
        for k, sid in zip((4, 2, 1), sids):
            LIB.step_serve(sid, stream, True)
            _, out = run_step(stream, scale=k)
            LIB.step_end(sid)
            LIB.free(out)
        self.assertEqual(sum(m["divergences"] for m in LIB.family_report(fid)["members"]), 0)
        LIB.family_close(fid)
        LIB.family_close(other)

    def test_family_one_arena_and_plan_file(self):
        stream = 0x5151
        fid = LIB.family_new(0, "decode")
        sids = []
        for k in (4, 2, 1):
            sid = LIB.family_member(fid, f"bs{k}")
            LIB.step_record(sid, stream)
            _, out = run_step(stream, scale=k)
            LIB.step_end(sid)
            LIB.free(out)
            sids.append(sid)
        LIB.family_plan(fid, 1.0)
        r = LIB.family_report(fid)
        self.assertGreaterEqual(r["arena"], r["lower_bound"])
        self.assertLess(r["arena"], sum(m["lower_bound"] for m in r["members"]))
        seen = {}
        for k, sid in [(1, sids[2]), (4, sids[0]), (1, sids[2])]:
            LIB.step_serve(sid, stream, True)
            addrs, out = run_step(stream, scale=k)
            LIB.step_end(sid)
            LIB.free(out)
            if k in seen:
                self.assertEqual(addrs, seen[k])
            seen[k] = addrs
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "f.plan")
            LIB.family_save(fid, path)
            LIB.family_close(fid)
            other = LIB.family_new(0, "decode")
            LIB.family_member(other, "bs4")
            with self.assertRaises(PlanMismatchError):
                LIB.family_load(other, path)
            LIB.family_close(other)

    def test_family_member_planned_around_a_held_output(self):
        # A member recorded and planned while the first member's output is
        # held in the arena: its allocations never meet it, and the arena
        # grows in place where the member needs more room.
        stream = 0x5252
        fid, first, second, _, held = planned_pair(stream, "frames")
        arena = LIB.family_report(fid)["arena"]
        LIB.family_plan_member_around(fid, second, 1.0, [(held, held + 8192)])
        r = LIB.family_report(fid)
        self.assertGreater(r["arena"], arena, "the arena grew for the larger member")
        self.assertLess(r["arena"], arena + r["members"][1]["lower_bound"], "not the sum of the two")
        for _ in range(2):
            LIB.step_serve(second, stream, True)
            addrs, out = run_step(stream, scale=3)
            LIB.step_end(second)
            LIB.free(out)
            self.assertFalse([a for a in addrs if held - 65536 < a < held + 8192],  # none is larger than 64 KiB
                             "an allocation of the second member meets the held output")
        self.assertEqual(LIB.family_report(fid)["members"][1]["divergences"], 0)
        LIB.free(held)
        with self.assertRaises(ArenaplanError):
            LIB.family_plan_member_around(fid, 999999, 1.0, [])
        LIB.family_close(fid)

    def test_family_member_replanned_around_a_held_output(self):
        # The first member planned again around the second one's output,
        # held across its replays: its output stays where it was, none of
        # its allocations meets the held output any more. A held range on
        # its own output is refused, the member's plan kept.
        stream = 0x5353
        fid, first, second, before, out_a = planned_pair(stream, "loop")
        LIB.family_plan_member_around(fid, second, 1.0, [(out_a, out_a + 8192)])
        LIB.free(out_a)
        LIB.step_serve(second, stream, True)
        _, held = run_step(stream, scale=3)
        LIB.step_end(second)
        sizes = [n for i in range(6) for n in (4096 + 1000 * i, 65536)] + [8192]  # run_step's, in order
        meets = lambda addrs: [a for a, n in zip(addrs, sizes) if a < held + 8192 and held < a + n]  # noqa: E731
        self.assertTrue(meets(before), "the first member's plan avoids the held output already: this proves nothing")
        with self.assertRaises(ArenaplanError):
            LIB.family_replan_member_around(fid, first, 1.0, [(out_a, out_a + 16)])
        LIB.family_replan_member_around(fid, first, 1.0, [(held, held + 8192)])
        for _ in range(2):
            LIB.step_serve(first, stream, True)
            addrs, out = run_step(stream)
            LIB.step_end(first)
            LIB.free(out)
            self.assertEqual(out, out_a, "its output stays where it was")
            self.assertFalse(meets(addrs), "an allocation of the replanned member meets the held output")
        r = LIB.family_report(fid)["members"][0]
        self.assertEqual((r["replans"], r["divergences"]), (1, 0))
        LIB.free(held)
        LIB.family_close(fid)

    def test_region_pause_resume(self):
        import threading
        tid = threading.get_native_id()
        LIB.region_begin(0, tid, "pyweights", True)
        w = LIB.alloc(3 << 20)
        LIB.region_end(0, tid)
        self.assertTrue(w)
        before = LIB.stats(0)["Spill"]["Mapped"]
        LIB.pause(0, ["pyweights"])
        self.assertLess(LIB.stats(0)["Spill"]["Mapped"], before)
        with self.assertRaises(ArenaplanError):
            LIB.pause(0, ["pyweights"])
        LIB.region_begin(0, tid, "pykv", False)
        kv = LIB.alloc(1 << 20)
        LIB.region_end(0, tid)
        with self.assertRaises(ArenaplanError):
            LIB.region_begin(0, tid, "pyweights", True)  # paused
        LIB.resume(0, ["pyweights"])
        with self.assertRaises(ArenaplanError):
            LIB.resume(0, ["pyweights"])
        LIB.free(w)
        LIB.free(kv)


class HeaderTest(unittest.TestCase):
    """arenaplan._lib.SIGNATURES, the package's one table of the C ABI,
    against the library's public header: every export the package calls
    is declared there with the same types."""

    HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "cmd", "libarenaplan", "arenaplan.h")

    @staticmethod
    def prototypes(text):
        import re
        text = re.sub(r"//[^\n]*", "", text)
        out = {}
        for m in re.finditer(r"([A-Za-z_][\w ]*?[\s*]+)(arenaplan_\w+)\s*\(([^)]*)\)\s*;", text):
            ret = " ".join(m.group(1).replace("*", " * ").split()).replace(" *", " *")
            args = []
            for a in m.group(3).split(","):
                a = a.strip()
                if a in ("", "void"):
                    continue
                a = re.sub(r"\b\w+$", "", a).strip()  # drop the parameter's name
                args.append(" ".join(a.replace("*", " * ").split()).replace("* *", "**"))
            out[m.group(2)] = (ret.replace("* *", "**"), args)
        return out

    def test_signatures_match_the_header(self):
        from arenaplan import _lib
        with open(self.HEADER) as f:
            decl = self.prototypes(f.read())
        self.assertIn("arenaplan_alloc", decl, "the header parses")
        for name, (ret, args) in _lib.SIGNATURES.items():
            self.assertIn(name, decl, f"{name} is not in arenaplan.h")
            self.assertEqual(decl[name], (ret, args), f"{name}: the package's signature differs from arenaplan.h's")

    def test_a_wrong_signature_is_seen(self):
        decl = self.prototypes("char *arenaplan_x(int device, char **out);\nvoid arenaplan_y(uintptr_t fn);")
        self.assertEqual(decl["arenaplan_x"], ("char *", ["int", "char **"]))
        self.assertEqual(decl["arenaplan_y"], ("void", ["uintptr_t"]))
        self.assertNotEqual(decl["arenaplan_x"], ("char *", ["int", "char *"]))
