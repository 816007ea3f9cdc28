"""``arm --on hang SECONDS``: a watched thread whose stack has not changed for SECONDS.

No hook and no per-step cost: the armory's watcher thread (which sleeps between looks) reads
``sys._current_frames()`` about every second and keeps, per watched thread, a signature of its
whole stack (each frame's code object and line) and the step count. A thread that moves, or a
step that ends, resets the timer. A long op inside one line (a big matmul, a collective) also
keeps the stack still: SECONDS must be longer than the longest honest step, as with torchrun's
own timeout. The watched thread is the one that calls ``optimizer.step()`` once one has, else
the main thread; ``--threads all``: fire when no thread moves. After a fire the trigger waits for the thread to move before it can fire again.

Evidence: every thread's stack with its kernel counters (``stacks.json``, the ``stack
--progress`` answer), the watched thread's innermost frame of the program's own code
(``event.json`` "where"), and torch's Flight Recorder dump (``fr_trace.pickle``, torch's own
format) when torch.distributed is initialised and the job records one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from . import capture
from .base import Trigger
from .evidence import Event, EvidenceDir

_MAX_DEPTH = 300


def _signature(frame: Any) -> tuple[tuple[int, int], ...]:
    sig = []
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        sig.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
        depth += 1
    return tuple(sig)


def _frames(frame: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < _MAX_DEPTH:
        code = frame.f_code
        out.append({"file": code.co_filename, "line": frame.f_lineno,
                    "function": getattr(code, "co_qualname", code.co_name)})
        frame = frame.f_back
    out.reverse()
    return out


def fr_dump() -> tuple[bytes | None, str]:
    """torch's Flight Recorder dump (its pickle, as bytes: never unpickled here), or why not."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not (dist.is_available() and dist.is_initialized()):
            return None, "torch.distributed is not initialised"
    except Exception as exc:
        return None, f"torch.distributed state unknown: {type(exc).__name__}"
    size = os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip()
    if not size or size == "0":
        return None, "TORCH_FR_BUFFER_SIZE is not set in the job: no Flight Recorder"
    torch = sys.modules.get("torch")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return None, "this torch has no Flight Recorder dump"
    try:
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except Exception as exc:
        return None, f"Flight Recorder dump failed: {type(exc).__name__}: {exc}"
    return (bytes(raw), "") if raw else (None, "Flight Recorder dump empty")


class HangTrigger(Trigger):
    kind = "hang"

    def __init__(self, out: EvidenceDir, max_fires: int, rank: dict[str, Any], seconds: float,
                 threads: str = "main") -> None:
        super().__init__(out, max_fires, rank)
        self.seconds = seconds
        self.threads = threads  # "main" | "all": fire when every watched thread is still
        # A training job's steps are progress too, and tell which thread trains (a worker
        # thread while main waits in join() is not a hang): the step clock when torch.optim is in.
        self.needs_clock = "torch.optim.optimizer" in sys.modules
        self._seen: dict[int, tuple[tuple[tuple[int, int], ...], float]] = {}
        self._steps = -1
        self._fired_on: dict[int, tuple[tuple[int, int], ...]] | None = None
        self.stalled_s = 0.0

    def params(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "threads": self.threads}

    def detail(self) -> dict[str, Any]:
        return {"stalled_s": round(self.stalled_s, 1)}

    def _watched(self) -> list[threading.Thread]:
        if self.threads == "main":
            stepping = self.clock.thread if self.clock is not None else None
            for thread in threading.enumerate() if stepping is not None else ():
                if thread.ident == stepping:
                    return [thread]
            return [threading.main_thread()]
        return [t for t in threading.enumerate()
                if not t.name.startswith("flight_profiler-") and t.ident is not None]

    def tick(self, now: float) -> None:
        if not self.live:
            return
        steps = self.clock.steps if self.clock is not None else 0
        progressed = steps != self._steps
        self._steps = steps
        frames = sys._current_frames()
        try:
            sigs = {}
            for thread in self._watched():
                frame = frames.get(thread.ident or -1)
                if frame is not None:
                    sigs[thread.ident or -1] = _signature(frame)
        finally:
            del frames
        if not sigs:
            return
        stalled = []
        for ident, sig in sigs.items():
            old = self._seen.get(ident)
            if old is None or old[0] != sig or progressed:
                self._seen[ident] = (sig, now)
            stalled.append(now - self._seen[ident][1])
        for ident in list(self._seen):
            if ident not in sigs:
                del self._seen[ident]
        self.stalled_s = min(stalled)
        if self._fired_on is not None:
            if self._fired_on == sigs and not progressed:
                return  # the same hang already fired: wait for it to move
            self._fired_on = None
        if self.stalled_s >= self.seconds and self.begin_fire():
            try:
                self._fired_on = sigs
                self.write_event(lambda event: self._capture(event, sorted(sigs)))
            finally:
                self.end_fire()

    def _capture(self, event: Event, idents: list[int]) -> dict[str, Any]:
        doc: dict[str, Any] = {"stalled_s": round(self.stalled_s, 3), "watched": self.threads}
        frames = sys._current_frames()
        try:
            stacks = {ident: _frames(frames.get(ident)) for ident in idents}
        finally:
            del frames
        names = {t.ident: t.name for t in threading.enumerate()}
        hung = []
        for ident, stack in stacks.items():
            hung.append({"thread": names.get(ident, str(ident)), "ident": ident,
                         "where": capture.program_frame(stack), "frames": stack[-12:]})
        doc["threads"] = hung
        doc["where"] = hung[0]["where"] if hung else None
        sample = capture.stack_sample()
        event.write_json("stacks.json", sample)
        raw, why = fr_dump()
        if raw is not None:
            event.write("fr_trace.pickle", lambda f: f.write(raw))
        else:
            doc["fr"] = why
        doc["time_monotonic"] = time.monotonic()
        return doc
