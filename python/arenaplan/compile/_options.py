"""The backend's options: torch.compile's ``mode`` and ``options``, validated."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

NAME = "arenaplan"
_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class CompileOptions:
    """The backend's options, validated: a bad value raises ValueError."""

    _KEYS = {"warmup": int, "capture_warmup": int, "max_shapes": int, "budget": float, "strict": bool,
             "capture": bool, "share_frames": bool, "from_mode": str}

    def __init__(self, mode: Optional[str] = None, options: Optional[Dict[str, Any]] = None):
        self.mode = mode or "default"
        if self.mode not in _MODES:
            raise ValueError(f"arenaplan: mode={mode!r}: want one of {_MODES}")
        self.warmup, self.capture_warmup, self.max_shapes = 1, 2, 8
        self.budget, self.strict, self.capture = 1.0, False, True
        self.share_frames = True  # graphs of other frames may join this one's arena (see _infer._Group)
        self.from_mode: Optional[str] = None  # what the program asked torch.compile for, where it was routed here
        self.inductor: Dict[str, Any] = {}
        for k, v in (options or {}).items():
            want = self._KEYS.get(k)
            if want is None:
                self.inductor[k] = v
                continue
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ValueError(f"arenaplan: option {k}={v!r}: want {want.__name__}")
            setattr(self, k, v)
        if mode is None and self.from_mode in _MODES:
            self.mode = self.from_mode  # routed: the mode the program asked for (its inductor options)
        if self.warmup < 0:
            raise ValueError(f"arenaplan: option warmup={self.warmup}: want >= 0")
        if self.capture_warmup < 1:
            raise ValueError(f"arenaplan: option capture_warmup={self.capture_warmup}: want >= 1 "
                             "(the last capture warm-up run is the one recorded)")
        if self.max_shapes < 1:
            raise ValueError(f"arenaplan: option max_shapes={self.max_shapes}: want >= 1")
        if self.budget <= 0:
            raise ValueError(f"arenaplan: option budget={self.budget}: want > 0")
        if self.inductor.get("triton.cudagraphs"):
            raise ValueError("arenaplan: option triton.cudagraphs=True: the backend's graphs replace inductor's; "
                             "use backend='inductor' for CUDAGraph Trees")

    def inductor_patches(self, mode_options: Callable[[str], Dict[str, Any]]) -> Dict[str, Any]:
        """Inductor's config patches: the mode's, the caller's, and its own
        CUDA graphs off."""
        patches: Dict[str, Any] = {}
        if self.mode not in ("default", "reduce-overhead"):
            patches.update(mode_options(self.mode))
        patches.update(self.inductor)
        patches["triton.cudagraphs"] = False
        return patches
