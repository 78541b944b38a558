"""ctypes binding of libarenaplan.so (no torch needed; tests use it on the
simulated device with ARENAPLAN_DEVICE=sim)."""
from __future__ import annotations

import ctypes
import json
import os
from typing import Optional

_c_char_pp = ctypes.POINTER(ctypes.c_char_p)


class ArenaplanError(RuntimeError):
    """An error the library reported (device memory, a bad plan, misuse)."""


class PlanMismatchError(ArenaplanError, ValueError):
    """A plan file made for another step."""


def torch_missing(module: str, err: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error an import of ``module`` raises where PyTorch is missing:
    ``err`` itself when another module is missing, else one that says
    what to do."""
    if err.name not in ("torch", None) and not (err.name or "").startswith("torch."):
        return err
    return ModuleNotFoundError(
        f"{module} needs PyTorch 2.4 or newer, which this Python cannot import ({err}): "
        "install the build for your CUDA version (https://pytorch.org/get-started/locally/), "
        "or `pip install 'arenaplan[torch]'`. Without PyTorch, arenaplan._lib drives the "
        "library's C ABI (ARENAPLAN_DEVICE=sim runs it with no GPU).",
        name="torch",
    )


def default_path() -> str:
    """The library: $ARENAPLAN_LIB, else the one installed with this package."""
    env = os.environ.get("ARENAPLAN_LIB")
    if env:
        return os.path.realpath(env)
    return os.path.realpath(os.path.join(os.path.dirname(__file__), "_lib", "libarenaplan.so"))


class Library:
    """The exported C functions of one loaded libarenaplan.so.

    Load it once per process, from one path: a second copy of a Go shared
    library in one process is fatal, and dlopen of the same file returns
    the same handle.
    """

    def __init__(self, path: Optional[str] = None):
        self.path = os.path.realpath(path or default_path())
        if not os.path.exists(self.path):
            raise ArenaplanError(
                f"arenaplan: {self.path} not found: install the package with "
                "`python3 -m pip install --no-build-isolation ./python` (needs Go), or set ARENAPLAN_LIB")
        lib = ctypes.CDLL(self.path)
        self._lib = lib
        vp, ci, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p
        err = ctypes.c_void_p  # a char* we must free, so not c_char_p
        sig = {
            "arenaplan_alloc": (vp, [ctypes.c_size_t, ci, vp]),
            "arenaplan_free": (None, [vp, ctypes.c_size_t, ci, vp]),
            "arenaplan_last_error": (err, []),
            "arenaplan_captures_underway": (None, [ci]),
            "arenaplan_free_string": (None, [vp]),
            "arenaplan_step_new": (err, [ci, ctypes.c_char_p, ctypes.POINTER(ci)]),
            "arenaplan_step_record": (err, [ci, vp]),
            "arenaplan_step_serve": (err, [ci, vp, ci]),
            "arenaplan_step_join_capture": (err, [ci]),
            "arenaplan_step_end": (err, [ci, ci]),
            "arenaplan_step_plan": (err, [ci, ctypes.c_double]),
            "arenaplan_step_replan": (err, [ci, ctypes.c_double]),
            "arenaplan_step_save": (err, [ci, ctypes.c_char_p]),
            "arenaplan_step_load": (err, [ci, ctypes.c_char_p]),
            "arenaplan_step_close": (err, [ci]),
            "arenaplan_step_report": (err, [ci, ctypes.POINTER(cp)]),
            "arenaplan_stats": (err, [ci, ctypes.POINTER(cp)]),
            "arenaplan_family_new": (err, [ci, ctypes.c_char_p, ctypes.POINTER(ci)]),
            "arenaplan_chain_new": (err, [ci, ctypes.c_char_p, ctypes.POINTER(ci)]),
            "arenaplan_family_member": (err, [ci, ctypes.c_char_p, ctypes.POINTER(ci)]),
            "arenaplan_family_plan": (err, [ci, ctypes.c_double]),
            "arenaplan_family_plan_member": (err, [ci, ci, ctypes.c_double]),
            "arenaplan_family_save": (err, [ci, ctypes.c_char_p]),
            "arenaplan_family_load": (err, [ci, ctypes.c_char_p]),
            "arenaplan_family_close": (err, [ci]),
            "arenaplan_family_report": (err, [ci, ctypes.POINTER(cp)]),
            "arenaplan_region_begin": (err, [ci, ctypes.c_long, ctypes.c_char_p, ci]),
            "arenaplan_region_end": (err, [ci, ctypes.c_long]),
            "arenaplan_pause": (err, [ci, ctypes.c_char_p]),
            "arenaplan_resume": (err, [ci, ctypes.c_char_p]),
            "arenaplan_paused": (err, [ci, ctypes.POINTER(cp)]),
        }
        for name, (res, args) in sig.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        # Moves on every pause and resume: what paused() answered holds
        # while it stays (read without a call, for replays).
        self._pause_gen = ctypes.c_uint64.in_dll(lib, "arenaplan_pause_generation")
        self._paused_cache: dict = {}  # device -> (generation, frozenset of tags)

    def address(self, name: str) -> int:
        """The C address of an exported function (for PyTorch's hooks)."""
        return ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value

    def _take(self, p) -> Optional[str]:
        if not p:
            return None
        s = ctypes.string_at(p).decode("utf-8", "replace")
        self._lib.arenaplan_free_string(p)
        return s

    def check(self, p, mismatch: bool = False) -> None:
        msg = self._take(p)
        if msg is not None:
            if mismatch and any(w in msg for w in ("another step", "another family", "made by rank")):
                raise PlanMismatchError(msg)
            raise ArenaplanError(msg)

    def last_error(self) -> Optional[str]:
        """The last failure of an allocator call made on this thread, or
        None; an allocator call that succeeds clears it."""
        return self._take(self._lib.arenaplan_last_error())

    def captures_underway(self, n: int) -> None:
        """Tell the library how many graph captures are underway (from then
        on it asks the driver about capture only while n > 0)."""
        self._lib.arenaplan_captures_underway(n)

    # The allocator pair for C callers (0 on failure, the reason in
    # last_error), for tests without torch. PyTorch calls
    # arenaplan_torch_alloc, which throws a C++ exception instead.
    def alloc(self, size: int, device: int = 0, stream: int = 0) -> int:
        return self._lib.arenaplan_alloc(size, device, stream) or 0

    def free(self, ptr: int, size: int = 0, device: int = 0, stream: int = 0) -> None:
        self._lib.arenaplan_free(ptr, size, device, stream)

    # Steps.
    def step_new(self, device: int, name: str) -> int:
        i = ctypes.c_int(-1)
        self.check(self._lib.arenaplan_step_new(device, name.encode(), ctypes.byref(i)))
        return i.value

    def step_record(self, sid: int, stream: int) -> None:
        self.check(self._lib.arenaplan_step_record(sid, stream))

    def step_serve(self, sid: int, stream: int, strict: bool) -> None:
        self.check(self._lib.arenaplan_step_serve(sid, stream, int(strict)))

    def step_join_capture(self, sid: int) -> None:
        self.check(self._lib.arenaplan_step_join_capture(sid))

    def step_end(self, sid: int, failed: bool = False) -> None:
        self.check(self._lib.arenaplan_step_end(sid, int(failed)), mismatch=True)

    def step_plan(self, sid: int, budget_s: float) -> None:
        self.check(self._lib.arenaplan_step_plan(sid, budget_s))

    def step_replan(self, sid: int, budget_s: float) -> None:
        self.check(self._lib.arenaplan_step_replan(sid, budget_s))

    def step_save(self, sid: int, path: str) -> None:
        self.check(self._lib.arenaplan_step_save(sid, os.fsencode(path)))

    def step_load(self, sid: int, path: str) -> None:
        self.check(self._lib.arenaplan_step_load(sid, os.fsencode(path)), mismatch=True)

    def step_close(self, sid: int) -> None:
        self.check(self._lib.arenaplan_step_close(sid))

    def step_report(self, sid: int) -> dict:
        out = ctypes.c_void_p()
        self.check(self._lib.arenaplan_step_report(sid, ctypes.byref(out)))
        return json.loads(self._take(out))

    def stats(self, device: int = 0) -> dict:
        out = ctypes.c_void_p()
        self.check(self._lib.arenaplan_stats(device, ctypes.byref(out)))
        return json.loads(self._take(out))

    # Families.
    def family_new(self, device: int, name: str) -> int:
        i = ctypes.c_int(-1)
        self.check(self._lib.arenaplan_family_new(device, name.encode(), ctypes.byref(i)))
        return i.value

    def chain_new(self, device: int, name: str) -> int:
        """A family whose members run in turn and hand buffers on."""
        i = ctypes.c_int(-1)
        self.check(self._lib.arenaplan_chain_new(device, name.encode(), ctypes.byref(i)))
        return i.value

    def family_member(self, fid: int, name: str) -> int:
        i = ctypes.c_int(-1)
        self.check(self._lib.arenaplan_family_member(fid, name.encode(), ctypes.byref(i)))
        return i.value

    def family_plan(self, fid: int, budget_s: float) -> None:
        self.check(self._lib.arenaplan_family_plan(fid, budget_s))

    def family_plan_member(self, fid: int, sid: int, budget_s: float) -> None:
        self.check(self._lib.arenaplan_family_plan_member(fid, sid, budget_s))

    def family_save(self, fid: int, path: str) -> None:
        self.check(self._lib.arenaplan_family_save(fid, os.fsencode(path)))

    def family_load(self, fid: int, path: str) -> None:
        self.check(self._lib.arenaplan_family_load(fid, os.fsencode(path)), mismatch=True)

    def family_close(self, fid: int) -> None:
        self.check(self._lib.arenaplan_family_close(fid))

    def family_report(self, fid: int) -> dict:
        out = ctypes.c_void_p()
        self.check(self._lib.arenaplan_family_report(fid, ctypes.byref(out)))
        return json.loads(self._take(out))

    # Sleep and wake.
    def region_begin(self, device: int, thread: int, tag: str, backup: bool) -> None:
        self.check(self._lib.arenaplan_region_begin(device, thread, tag.encode(), int(backup)))

    def region_end(self, device: int, thread: int) -> None:
        self.check(self._lib.arenaplan_region_end(device, thread))

    def pause(self, device: int, tags) -> None:
        self.check(self._lib.arenaplan_pause(device, ",".join(tags).encode()))

    def resume(self, device: int, tags) -> None:
        self.check(self._lib.arenaplan_resume(device, ",".join(tags).encode()))

    def paused(self, device: int) -> frozenset:
        """The tags paused on device, as the library holds them ("graphs":
        the captured graphs' memory). Costs one call into the library."""
        out = ctypes.c_void_p()
        self.check(self._lib.arenaplan_paused(device, ctypes.byref(out)))
        s = self._take(out)
        return frozenset(s.split(",")) if s else frozenset()

    def graphs_paused(self, device: int) -> bool:
        """Whether the graphs' memory of device is paused: a read of the
        pause generation, and a call into the library only after a pause
        or resume (cheap enough for every replay)."""
        gen = self._pause_gen.value
        c = self._paused_cache.get(device)
        if c is None or c[0] != gen:
            c = (gen, self.paused(device))
            self._paused_cache[device] = c
        return "graphs" in c[1]
