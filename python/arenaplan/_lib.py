"""ctypes binding of libarenaplan.so (no torch needed; tests use it on the
simulated device with ARENAPLAN_DEVICE=sim)."""
from __future__ import annotations

import ctypes
import json
import os
from typing import Optional, Sequence, Tuple

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


# Every export the package calls, as cmd/libarenaplan/arenaplan.h declares
# it: (return type, argument types), in C. The one table of the ABI on the
# Python side (python/tests/test_lib.py checks it against the header).
SIGNATURES = {
    "arenaplan_alloc": ("void *", ["size_t", "int", "void *"]),
    "arenaplan_free": ("void", ["void *", "size_t", "int", "void *"]),
    "arenaplan_last_error": ("char *", []),
    "arenaplan_captures_underway": ("void", ["int"]),
    "arenaplan_free_string": ("void", ["char *"]),
    "arenaplan_step_new": ("char *", ["int", "char *", "int *"]),
    "arenaplan_step_record": ("char *", ["int", "void *"]),
    "arenaplan_step_serve": ("char *", ["int", "void *", "int"]),
    "arenaplan_step_join_capture": ("char *", ["int"]),
    "arenaplan_step_end": ("char *", ["int", "int"]),
    "arenaplan_step_plan": ("char *", ["int", "double"]),
    "arenaplan_step_replan": ("char *", ["int", "double"]),
    "arenaplan_step_drop_captures": ("char *", ["int"]),
    "arenaplan_step_save": ("char *", ["int", "char *"]),
    "arenaplan_step_load": ("char *", ["int", "char *"]),
    "arenaplan_step_close": ("char *", ["int"]),
    "arenaplan_step_report": ("char *", ["int", "char **"]),
    "arenaplan_stats": ("char *", ["int", "char **"]),
    "arenaplan_memory_stats": ("char *", ["int", "char **"]),
    "arenaplan_reset_peak_stats": ("char *", ["int"]),
    "arenaplan_reset_accumulated_stats": ("char *", ["int"]),
    "arenaplan_snapshot": ("char *", ["int", "char **"]),
    "arenaplan_record_history": ("char *", ["int", "int"]),
    "arenaplan_history_hook": ("void", ["uintptr_t"]),
    "arenaplan_family_new": ("char *", ["int", "char *", "int *"]),
    "arenaplan_chain_new": ("char *", ["int", "char *", "int *"]),
    "arenaplan_family_member": ("char *", ["int", "char *", "int *"]),
    "arenaplan_family_plan": ("char *", ["int", "double"]),
    "arenaplan_family_plan_ahead": ("char *", ["int", "int", "double"]),
    "arenaplan_family_plan_member": ("char *", ["int", "int", "double"]),
    "arenaplan_family_plan_member_around": ("char *", ["int", "int", "double", "uint64_t *", "int"]),
    "arenaplan_family_replan_member_around": ("char *", ["int", "int", "double", "uint64_t *", "int"]),
    "arenaplan_family_save": ("char *", ["int", "char *"]),
    "arenaplan_family_load": ("char *", ["int", "char *"]),
    "arenaplan_family_close": ("char *", ["int"]),
    "arenaplan_family_report": ("char *", ["int", "char **"]),
    "arenaplan_region_begin": ("char *", ["int", "long int", "char *", "int"]),
    "arenaplan_region_end": ("char *", ["int", "long int"]),
    "arenaplan_pause": ("char *", ["int", "char *"]),
    "arenaplan_resume": ("char *", ["int", "char *"]),
    "arenaplan_paused": ("char *", ["int", "char **"]),
    "arenaplan_mempool_new": ("char *", ["uintptr_t", "uintptr_t", "int *"]),
    "arenaplan_mempool_new_graphs": ("char *", ["int *"]),
    "arenaplan_mempool_begin": ("char *", ["int", "long int", "int"]),
    "arenaplan_mempool_end": ("char *", ["int", "long int", "int"]),
    "arenaplan_mempool_release": ("char *", ["int"]),
    "arenaplan_mempool_stats": ("char *", ["int", "char **"]),
}

_CTYPES = {"void": None, "void *": ctypes.c_void_p, "size_t": ctypes.c_size_t,
           "uintptr_t": ctypes.c_void_p,  # an address: None, an int or a c_void_p
           "int": ctypes.c_int, "long int": ctypes.c_long, "double": ctypes.c_double,
           "int *": ctypes.POINTER(ctypes.c_int), "char **": ctypes.POINTER(ctypes.c_void_p),
           "uint64_t *": ctypes.POINTER(ctypes.c_uint64)}


def _ranges(held: Sequence[Tuple[int, int]]):
    """(start, end) address pairs as the C ABI takes them: a uint64_t array
    of 2n values, and n."""
    return (ctypes.c_uint64 * (2 * len(held)))(*[int(v) for r in held for v in r]), len(held)


def ctype(c: str, owned: bool):
    """The ctypes type of C type c. A char * the library hands out (a
    return value) or takes back to free (arenaplan_free_string's argument)
    is an address, not c_char_p, which would copy and drop it; any other
    char * argument is a string passed in."""
    if c == "char *":
        return ctypes.c_void_p if owned else ctypes.c_char_p
    return _CTYPES[c]


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
        for name, (res, args) in SIGNATURES.items():
            f = getattr(lib, name)
            f.restype = ctype(res, True)
            f.argtypes = [ctype(a, name == "arenaplan_free_string") for a in args]
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

    def step_drop_captures(self, sid: int) -> None:
        self.check(self._lib.arenaplan_step_drop_captures(sid))

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

    def family_plan_ahead(self, fid: int, sid: int, budget_s: float) -> None:
        """Start planning recorded member sid in the background; a
        family_plan with the same budget takes that plan."""
        self.check(self._lib.arenaplan_family_plan_ahead(fid, sid, budget_s))

    def family_plan_member(self, fid: int, sid: int, budget_s: float) -> None:
        self.check(self._lib.arenaplan_family_plan_member(fid, sid, budget_s))

    def family_plan_member_around(self, fid: int, sid: int, budget_s: float,
                                  held: Sequence[Tuple[int, int]]) -> None:
        """family_plan_member for a member that replays while the program
        holds the device memory ``held`` ((start, end) address pairs) in
        the family's arena: its plan leaves them alone, and the arena
        grows in place where it needs more room."""
        self.check(self._lib.arenaplan_family_plan_member_around(fid, sid, budget_s, *_ranges(held)))

    def family_replan_member_around(self, fid: int, sid: int, budget_s: float,
                                    held: Sequence[Tuple[int, int]]) -> None:
        """Plan member sid, planned already, again so that it leaves
        ``held`` ((start, end) address pairs in the family's arena) alone
        too, its outputs kept where they are; the arena grows in place
        where it needs more room. Reset the member's graphs first (its
        capture pools are released). On an error (a held range on one of
        its outputs, none in the arena) it keeps its plan and captures."""
        self.check(self._lib.arenaplan_family_replan_member_around(fid, sid, budget_s, *_ranges(held)))

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
