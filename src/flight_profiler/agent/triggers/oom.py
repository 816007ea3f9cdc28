"""``arm --on oom``: running out of memory, caught at the moment it happens.

Three signals, none of which costs the job anything per step:
- ``--rss-limit BYTES`` (CPU): the armory's watcher reads ``/proc/self/statm`` about five times
  a second; above the limit it fires once, with a tensor census (who holds the memory), and
  again only after RSS has fallen 10% below the limit (a dip just under it is the same crossing).
- An out-of-memory error (``MemoryError``, ``torch.OutOfMemoryError``) that nobody caught:
  ``sys.excepthook`` and ``threading.excepthook`` are chained (the previous ones still run, and
  are put back on disarm if ours is still the one installed; otherwise ours stays as a pass-
  through). Tracing every exception through the step (sys.monitoring, a profile hook) would cost
  every call; an OOM a job catches and survives is, by definition, not what kills it.
- CUDA (verified on CPU only, with fakes): ``torch.cuda.memory._record_memory_history`` with a
  bounded ring (``max_entries``) and ``torch._C._cuda_attach_out_of_memory_observer``, whose
  callback writes ``torch.cuda.memory._snapshot()`` (torch's own pickle) at the failing
  allocation. torch cannot detach an observer: on disarm it becomes a no-op, and history
  recording is turned off again only if this trigger turned it on.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from typing import Any

from .. import cuda_history
from . import capture
from .base import Trigger
from .evidence import Event, EvidenceDir

HISTORY_ENTRIES = 100_000
EXCEPTION_WAIT_S = 15.0


# torch's CPU allocator raises a plain RuntimeError (c10::Error) when malloc fails, under
# RLIMIT_AS or a cgroup without overcommit: "[enforce fail at alloc_cpu.cpp:127] err == 0.
# DefaultCPUAllocator: can't allocate memory: you tried to allocate 20971520 bytes. Error code 12
# (Cannot allocate memory)" (torch 2.13 on Linux; "not enough memory" is its Windows wording).
_CPU_ALLOCATOR_WORDS = ("DefaultCPUAllocator: can't allocate memory",
                        "DefaultCPUAllocator: not enough memory")


def is_oom(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    if isinstance(exc, MemoryError):  # numpy's _ArrayMemoryError is one
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None)
    if isinstance(oom_type, type) and isinstance(exc, oom_type):
        return True
    if type(exc) is RuntimeError:
        text = str(exc)[:4000]
        return any(words in text for words in _CPU_ALLOCATOR_WORDS)
    return False


# A crossing of --rss-limit is over only once RSS falls this far below it: an allocator handing a
# freed activation back made RSS dip under the limit and cross it again half a second later,
# and that second "rss" event took the last --max-fires before the real out-of-memory error
# (CI, a job growing 2 MiB a step under RLIMIT_AS).
RSS_REARM_FRACTION = 0.9


class OomTrigger(Trigger):
    kind = "oom"

    def __init__(self, out: EvidenceDir, max_fires: int, rank: dict[str, Any],
                 rss_limit: int | None = None) -> None:
        super().__init__(out, max_fires, rank)
        self.rss_limit = rss_limit
        self.rss_peak = 0
        self._above = False
        self._old_sys: Any = None
        self._old_thread: Any = None
        self._cuda = False
        self._history_ours = False

    def params(self) -> dict[str, Any]:
        return {"rss_limit": self.rss_limit}

    def detail(self) -> dict[str, Any]:
        return {"rss_peak": self.rss_peak, "cuda_observer": self._cuda}

    # -- install / remove --------------------------------------------------------------------
    def install(self) -> list[str]:
        notes = []
        self._old_sys, sys.excepthook = sys.excepthook, self._sys_hook
        self._old_thread, threading.excepthook = threading.excepthook, self._thread_hook
        notes.append("an uncaught MemoryError / torch.OutOfMemoryError in any thread fires")
        if self.rss_limit:
            notes.append(f"RSS above {self.rss_limit} bytes fires (checked 5 times a second)")
        notes += self._install_cuda(sys.modules.get("torch"))
        return notes

    def _install_cuda(self, torch: Any) -> list[str]:
        cuda = getattr(torch, "cuda", None)
        attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
        try:
            if cuda is None or attach is None or not cuda.is_initialized():
                return []
            cuda_history.switch_on(torch, HISTORY_ENTRIES)
            self._history_ours = True
            attach(self._cuda_oom)
            self._cuda = True
        except Exception as exc:
            return [f"CUDA OOM observer not installed: {type(exc).__name__}: {exc}"]
        return [f"CUDA: memory history on (ring of {HISTORY_ENTRIES} entries), OOM observer attached"]

    def remove(self) -> list[str]:
        left = []
        if sys.excepthook == self._sys_hook:
            sys.excepthook = self._old_sys
        else:
            left.append("sys.excepthook was replaced after arm: ours stays as a pass-through")
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._old_thread
        else:
            left.append("threading.excepthook was replaced after arm: ours stays as a pass-through")
        if self._history_ours:
            torch = sys.modules.get("torch")
            try:
                cuda_history.switch_off(torch)
            except Exception as exc:
                left.append(f"CUDA memory history not turned off: {exc}")
            self._history_ours = False
        if self._cuda:
            left.append("torch cannot detach an OOM observer: ours stays, doing nothing")
        return left

    # -- signals -------------------------------------------------------------------------------
    def _sys_hook(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self.live and is_oom(exc):
                self.fire_exception(exc, "main")
        finally:
            (self._old_sys or sys.__excepthook__)(exc_type, exc, tb)

    def _thread_hook(self, args: Any) -> None:
        try:
            if self.live and is_oom(args.exc_value):
                self.fire_exception(args.exc_value, getattr(args.thread, "name", "?"))
        finally:
            (self._old_thread or threading.__excepthook__)(args)

    def fire_exception(self, exc: BaseException, thread: str) -> None:
        # The thread (often the job) dies of this error right after: worth waiting for an RSS
        # event the watcher is still writing rather than losing the OOM itself.
        deadline = time.monotonic() + EXCEPTION_WAIT_S
        while not self.begin_fire():
            if self.state != "firing" or time.monotonic() > deadline:
                return
            time.sleep(0.05)
        try:
            frames = capture.traceback_frames(exc)
            doc = {"signal": "exception", "error": f"{type(exc).__name__}: {str(exc)[:2000]}",
                   "thread": thread, "traceback": frames, "where": capture.program_frame(frames)}
            # The frames of the traceback are still alive here, and so is what their locals
            # hold: the census sees the memory as it was at the failing allocation.
            roots = capture.traceback_roots(exc, "MainThread" if thread == "main" else thread)
            try:
                self.write_event(lambda event: self._capture(event, doc, census=True, roots=roots))
            finally:
                roots.clear()
        finally:
            self.end_fire()

    def _cuda_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        if not self.live or not self.begin_fire():
            return
        try:
            doc = {"signal": "cuda", "device": device, "alloc_bytes": alloc,
                   "device_allocated": device_allocated, "device_free": device_free,
                   "where": capture.program_frame(capture.current_frames(skip=2))}
            self.write_event(lambda event: self._capture(event, doc, census=False, snapshot=True))
        finally:
            self.end_fire()

    def tick(self, now: float) -> None:
        rss = capture.rss_bytes()
        self.rss_peak = max(self.rss_peak, rss)
        if not self.rss_limit or not self.live:
            return
        if rss <= self.rss_limit:
            if rss <= self.rss_limit * RSS_REARM_FRACTION:
                self._above = False
            return
        if self._above or not self.begin_fire():
            return
        self._above = True  # fires once per crossing, not on every look above the limit
        try:
            doc = {"signal": "rss", "rss_bytes": rss, "rss_limit": self.rss_limit}
            self.write_event(lambda event: self._capture(event, doc, census=True))
        finally:
            self.end_fire()

    def _capture(self, event: Event, doc: dict[str, Any], census: bool, snapshot: bool = False,
                 roots: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
        doc = dict(doc, rss_bytes=doc.get("rss_bytes") or capture.rss_bytes())
        torch = sys.modules.get("torch")
        if torch is not None:
            doc["cuda"] = capture.cuda_devices(torch)
        if snapshot and torch is not None:
            snap = torch.cuda.memory._snapshot()
            data = pickle.dumps(snap, protocol=4)
            event.write("memory_snapshot.pickle", lambda f: f.write(data))
        event.write_json("stacks.json", capture.stack_sample())
        if census and torch is not None:
            found, why = capture.census(torch, 10.0, "arm oom", extra_roots=roots)
            if found is not None:
                event.write_json("census.json", found)
                doc["census_top"] = capture.census_top(found)
            else:
                doc["census"] = why
        return doc
