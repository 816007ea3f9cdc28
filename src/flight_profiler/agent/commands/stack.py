"""`stack`: every thread's Python stack, innermost frame last (like a traceback)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from ..registry import Context

_AGENT_THREAD_PREFIX = "flight_profiler-"
_MAX_FRAMES = 200


def _frames(frame: Any, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append({
            "file": code.co_filename,
            "line": frame.f_lineno,
            "function": getattr(code, "co_qualname", code.co_name),
        })
        frame = frame.f_back
    out.reverse()
    return out


def _under_bootstrap(frame: Any) -> Any:
    """The target's own frame under the bootstrap's, or None when the thread is all ours.

    A pending call runs the bootstrap on top of whatever the interrupted thread was doing, so
    while it is still starting the agent that thread's own stack lies below it; a native thread
    the injector started has nothing below.
    """
    outer = None
    f = frame
    while f is not None:
        if f.f_globals.get("__name__") == "_flight_profiler_bootstrap":
            outer = f
        f = f.f_back
    if outer is None:
        return frame
    wrapper = outer.f_back  # the text PyRun_SimpleString ran
    return wrapper.f_back if wrapper is not None else None


def _progress(native_id: int | None) -> dict[str, int] | None:
    """The thread's kernel counters (Linux): how often it blocked and woke up, and its CPU
    ticks. Two samples with the same stack tell "stuck" (no change) from "a loop that keeps
    passing the same line" (a sleep or a collective per step: hundreds of wake-ups a second).
    Opt-in: each read releases the GIL, which costs a busy target a switch interval."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/status", "rb") as fh:
            status = fh.read(4096)
        with open(f"/proc/self/task/{native_id}/stat", "rb") as fh:
            stat = fh.read(1024)
        switches = 0
        for line in status.splitlines():
            if line.startswith((b"voluntary_ctxt_switches:", b"nonvoluntary_ctxt_switches:")):
                switches += int(line.split()[1])
        # fields after the command name, which may hold spaces: utime and stime are 14 and 15
        fields = stat[stat.rindex(b")") + 2:].split()
        return {"switches": switches, "cpu_ticks": int(fields[11]) + int(fields[12])}
    except (OSError, ValueError, IndexError):
        return None


def handle(ctx: Context) -> dict[str, Any]:
    show_agent = bool(ctx.arg("all", False))
    limit = int(ctx.arg("limit", _MAX_FRAMES))
    with_progress = bool(ctx.arg("progress", False))
    names = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    me = threading.get_ident()
    # a bootstrap thread still starting the agent (see bootstrap.py)
    booting: frozenset[int] = getattr(sys.modules.get("_flight_profiler_agent_boot"), "busy", frozenset())
    threads: list[dict[str, Any]] = []
    hidden = 0
    frames = sys._current_frames()
    try:
        for ident, frame in frames.items():
            thread = names.get(ident)
            name = thread.name if thread is not None else f"Thread-{ident}"
            if ident in booting and not show_agent:
                frame = _under_bootstrap(frame)
            is_agent = ident == me or frame is None or name.startswith(_AGENT_THREAD_PREFIX)
            if is_agent and not show_agent:
                hidden += 1
                continue
            threads.append({
                "ident": ident,
                "native_id": getattr(thread, "native_id", None),
                "name": name,
                "daemon": bool(thread.daemon) if thread is not None else None,
                "main": ident == main_ident,
                "agent": is_agent,
                "frames": _frames(frame, limit),
            })
            if with_progress:
                threads[-1]["progress"] = _progress(getattr(thread, "native_id", None))
    finally:
        del frames  # frames keep the target's locals alive
    threads.sort(key=lambda t: (not t["main"], t["agent"], t["name"]))
    return {"threads": threads, "hidden_agent_threads": hidden}
