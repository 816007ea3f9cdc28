"""After ``arm --on nan`` fires: watch the training thread's next whole step op by op, to name the
op and line that make a NaN/Inf out of finite values (nan_watch.py's dispatch mode, with anomaly
mode on so that a backward op names the forward line it differentiates).

Both are entered in the training thread at the end of the step that fired (torch's optimizer
post-step hook) and left at the end of the next one, in the same thread:
* the dispatch mode is thread-local: only that thread can push or pop it. It is pushed only when
  that thread's mode stack is empty (pushed on top of the job's own mode, the job's ``__exit__``
  would pop ours and leave its own on the stack for ever) and popped only when it is on top;
  otherwise it stays as a pass-through and the pop is tried again at the next step.
* anomaly mode is process-wide (every thread pays for it while it is on): the flags found are put
  back exactly, from whichever thread ends the watch first (the training thread at the next step,
  or a disarm). ``torch anomaly`` uses the same flags: the two never run at once (nan_watch.BUSY).

A disarm, detach or --for expiry while the step is watched turns the mode into a pass-through at
once and restores the flags; the pop waits for the training thread's next step (the step clock
keeps its hook until then, step_clock.py ``pending``).

What it can see: the step after the one that fired. Where the NaN came from the data or from an
op that makes one from finite values at every step (log(0), 0/0, sqrt'(0)), it is seen again
there, with its op and line. Where the optimizer already applied the non-finite gradient, the
parameters are non-finite: every op of the next step reads them, no op makes a NaN out of finite
values, and the result says so (the first op that reads a non-finite parameter is named).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from .. import nan_watch

log = logging.getLogger("flight_profiler.agent")


def _compiled(torch: Any) -> bool:
    """Whether the job runs torch.compile'd code: under a user dispatch mode dynamo would run
    it eagerly for the watched step, or fail; not worth the risk to the job."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    try:
        counters = dynamo.utils.counters  # a defaultdict: .get, so that nothing is added to it
        return bool(counters.get("stats", {}).get("unique_graphs")) or bool(counters.get("frames", {}).get("ok"))
    except Exception:
        return True  # cannot tell: assume it does


class Locator:
    """One watched step of the training thread (see the module doc)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.thread: int | None = None
        self.watch: Any = None
        self.state: nan_watch.AnomalyState | None = None
        self.started_at: float | None = None
        self.seconds: float | None = None
        self.pushed = False
        self.skipped: str | None = None

    # -- the training thread ---------------------------------------------------------------
    def start(self) -> bool:
        """Enter the watch in the calling (training) thread; False with ``skipped`` saying why."""
        torch = self.torch
        stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
        if stack_len is None or not hasattr(torch, "set_anomaly_enabled"):
            self.skipped = "this torch has no dispatch-mode stack or anomaly mode to watch ops with"
            return False
        if stack_len() != 0:
            self.skipped = "the training thread runs under a dispatch mode of its own"
            return False
        if _compiled(torch):
            self.skipped = "the job runs torch.compile'd code (a dispatch mode would change how it runs)"
            return False
        if not nan_watch.BUSY.acquire(blocking=False):
            self.skipped = "a `torch anomaly` request is running (anomaly mode is process-wide)"
            return False
        try:
            self.watch = nan_watch.make_watch(torch)
            self.state = nan_watch.AnomalyState(torch)
            torch.set_anomaly_enabled(True, False)  # check_nan off: it would raise into backward
            self.watch.__enter__()
        except BaseException as exc:
            self._restore()
            self.skipped = f"could not watch ops: {type(exc).__name__}: {exc}"
            return False
        self.thread = threading.get_ident()
        self.pushed = True
        self.started_at = time.perf_counter()
        return True

    def finish(self) -> bool:
        """The watched step is over (training thread): stop looking, restore the flags, pop the
        mode. True when nothing of ours is left in this thread."""
        if self.watch is not None and not self.watch.off:
            self.watch.off = True
            if self.started_at is not None:
                self.seconds = time.perf_counter() - self.started_at
        self._restore()
        return self.try_pop()

    def try_pop(self) -> bool:
        """Pop the mode if this is its thread and it is on top of the stack."""
        if not self.pushed:
            return True
        if threading.get_ident() != self.thread:
            return False
        torch = self.torch
        try:
            n = torch._C._len_torch_dispatch_stack()
            if n == 0 or torch._C._get_dispatch_stack_at(n - 1) is not self.watch:
                return False
            self.watch.__exit__(None, None, None)
        except Exception:
            log.exception("arm: popping the NaN locator's dispatch mode failed")
            return False
        self.pushed = False
        return True

    # -- any thread ------------------------------------------------------------------------
    def abandon(self) -> None:
        """A disarm while the step is watched: look no further, put the flags back now."""
        if self.watch is not None:
            self.watch.off = True
        self._restore()

    def _restore(self) -> None:
        state, self.state = self.state, None
        if state is None:
            return
        try:
            state.restore()
        finally:
            nan_watch.BUSY.release()

    def result(self, step: int) -> dict[str, Any]:
        """What the watched step showed (for event.json's "located")."""
        if self.skipped:
            return {"step": step, "watched": False, "reason": self.skipped}
        watch = self.watch
        origin, first = watch.origin, watch.first
        return {"step": step, "watched": True, "ops_checked": watch.ops,
                "seconds": round(self.seconds, 4) if self.seconds is not None else None,
                "found": origin is not None, "origin": origin,
                "first_nonfinite": first if first is not origin else None}
