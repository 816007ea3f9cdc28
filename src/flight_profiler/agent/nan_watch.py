"""Find the operator that produced the first NaN/Inf during a call (``torch anomaly``).

Two torch mechanisms, both entered and left in the calling thread around each call:
* anomaly mode (``torch.set_anomaly_enabled(True, check_nan=False)``): every autograd node
  records the Python stack of the forward call that created it (``node.metadata["traceback_"]``).
  check_nan stays off: with it, backward RAISES on the first NaN, into the target's own code.
* a dispatch mode that looks at every operator's outputs (forward and backward; the autograd
  engine carries the calling thread's dispatch modes into backward) until one is non-finite
  while its inputs were finite: that operator made the first NaN. In backward, the node being
  run names the forward op, and anomaly mode gives its forward stack.

Anomaly mode is process-wide in torch 2.13: every thread pays its cost while a call runs.
The previous state (enabled, check_nan) is put back exactly when each call ends, however it
ends; only one ``torch anomaly`` runs at a time, so states never interleave.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_MAX_FRAMES = 12
BUSY = threading.Lock()  # one anomaly request at a time (see above)


def _user_frames(frames: list[traceback.FrameSummary]) -> list[str]:
    """The program's own frames, innermost last: torch's and ours left out."""
    keep = []
    for f in frames:
        name = f.filename
        if name.startswith(_HERE) or name.startswith("<flight_profiler") or f"{os.sep}torch{os.sep}" in name:
            continue
        keep.append(f"{name}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else ""))
    return keep[-_MAX_FRAMES:]


def _parse_traceback(lines: Any) -> list[str]:
    """anomaly mode's stored forward stack (traceback.format_stack lines) as our frame lines."""
    out = []
    for entry in lines or []:
        text = str(entry).strip()
        if not text.startswith("File "):
            continue
        head, _, code = text.partition("\n")
        try:
            parts = head.split(", ")
            name = parts[0][len('File "'):-1]
            lineno = int(parts[1].split()[1])
            func = parts[2].split(" ", 1)[1]
        except (IndexError, ValueError):
            continue
        if name.startswith(_HERE) or name.startswith("<flight_profiler") or f"{os.sep}torch{os.sep}" in name:
            continue
        out.append(f"{name}:{lineno} in {func}" + (f": {code.strip()}" if code.strip() else ""))
    return out[-_MAX_FRAMES:]


# Ops whose output is uninitialised memory: whatever bits it holds (NaN included) are not a
# result, so judging them named `aten.empty.memory_format` as the first NaN by chance.
_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                            "new_empty_strided", "resize_", "resize_as_"})


def _uninitialised(func: Any) -> bool:
    parts = str(func).split(".")
    return len(parts) >= 2 and parts[1] in _UNINITIALISED


def make_watch(torch: Any) -> Any:
    """A fresh dispatch mode instance (the class needs torch, which is only known at run time)."""
    dispatch = sys.modules.get("torch.utils._python_dispatch")
    if dispatch is None:
        raise RuntimeError("torch.utils._python_dispatch is not loaded in the target")
    tensor_type = torch.Tensor
    parameter_type = torch.nn.Parameter

    class NanWatch(dispatch.TorchDispatchMode):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.first: dict[str, Any] | None = None  # the first op whose output is non-finite
            self.origin: dict[str, Any] | None = None  # ... the first one whose inputs were finite
            self.ops = 0
            self.call = -1
            self.off = False  # a pass-through: the op runs, nothing is looked at

        def _bad(self, t: Any) -> bool:
            return isinstance(t, tensor_type) and t.is_floating_point() and t.numel() > 0 and \
                not bool(torch.isfinite(t).all())

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if self.off:
                return out
            self.ops += 1
            if self.origin is None:
                with contextlib.suppress(Exception):  # never into the target's op
                    self._check(func, args, kwargs, out)
            return out

        def _check(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
            if _uninitialised(func):
                return
            outs = out if isinstance(out, (list, tuple)) else (out,)
            bad = [o for o in outs if self._bad(o)]
            if not bad:
                return
            flat = [a for a in (*args, *(kwargs or {}).values())]
            flat += [x for a in flat if isinstance(a, (list, tuple)) for x in a]
            bad_inputs = [a for a in flat if self._bad(a)]
            if self.first is not None and bad_inputs:
                return  # NaN carried on from an earlier op: only an origin is still wanted
            node = torch._C._current_autograd_node()
            o = bad[0]
            info: dict[str, Any] = {
                "call": self.call, "op": str(func), "phase": "backward" if node is not None else "forward",
                "inputs_finite": not bad_inputs, "shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", ""),
                "nan": int(torch.isnan(o).sum()), "inf": int(torch.isinf(o).sum()), "op_index": self.ops,
            }
            if bad_inputs:
                info["nonfinite_input_is_parameter"] = any(isinstance(a, parameter_type) for a in bad_inputs)
            if node is not None:
                info["backward_node"] = type(node).__name__
                meta = getattr(node, "metadata", None) or {}
                info["forward_stack"] = _parse_traceback(meta.get("traceback_"))
            else:
                info["forward_stack"] = _user_frames(traceback.extract_stack()[:-3])
            if self.first is None:
                self.first = info
            if not bad_inputs:
                self.origin = info

    return NanWatch()


class AnomalyState:
    """The process-wide anomaly flags as found, to put back exactly."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.enabled = bool(torch.is_anomaly_enabled())
        check = getattr(torch, "is_anomaly_check_nan_enabled", None)
        self.check_nan = bool(check()) if check is not None else True

    def restore(self) -> None:
        self.torch.set_anomaly_enabled(self.enabled, self.check_nan)


def read_state(torch: Any) -> dict[str, bool]:
    state = AnomalyState(torch)
    return {"enabled": state.enabled, "check_nan": state.check_nan}
