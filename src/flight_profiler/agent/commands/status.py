"""`status`: who the agent is, what interpreter it lives in, torch/CUDA, and active hooks."""

from __future__ import annotations

import os
import sys
import threading
import time

from ..importing import still_importing

TYPE_CHECKING = False  # not typing's: a target without it pays ~5 ms for it (issue 23)
if TYPE_CHECKING:
    from typing import Any

    from ..registry import Context


def _torch_info() -> dict[str, Any]:
    # Never import torch: only report it if the target already did.
    torch = sys.modules.get("torch")
    if torch is None:
        return {"imported": False, "version": None, "cuda_available": None}
    if still_importing(torch):  # its `import torch` is running in another thread right now
        return {"imported": False, "importing": True, "version": None, "cuda_available": None}
    info: dict[str, Any] = {"imported": True, "version": getattr(torch, "__version__", None)}
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        info["cuda_version"] = getattr(getattr(torch, "version", None), "cuda", None)
        info["device_count"] = int(torch.cuda.device_count()) if info["cuda_available"] else 0
    except Exception as exc:  # a broken CUDA setup must not fail `status`
        info["cuda_available"] = None
        info["cuda_error"] = f"{type(exc).__name__}: {exc}"
    return info


def handle(ctx: Context) -> dict[str, Any]:
    agent = ctx.agent
    threads = threading.enumerate()
    own = [t for t in threads if t.name.startswith("flight_profiler-")]
    return {
        "agent_version": agent.version,
        "pid": os.getpid(),
        "python": {
            "version": ".".join(map(str, sys.version_info[:3])),
            "implementation": sys.implementation.name,
            "executable": sys.executable,
            "argv": list(sys.argv),
        },
        "uptime_s": round(time.time() - agent.started_at, 3),
        "threads": {"total": len(sys._current_frames()), "agent": len(own)},
        "torch": _torch_info(),
        "active_hooks": agent.active_hooks(),
        **_armed(),
    }


def _armed() -> dict[str, Any]:
    # Only when something was ever armed: status must not import the triggers to say "none".
    armory = sys.modules.get(f"{__name__.rsplit('.', 2)[0]}.triggers.armory")
    return {"arm": armory.ARMORY.describe()} if armory is not None else {}
