"""``torch anomaly``: run a method's next N calls under anomaly detection and name the forward
op and Python stack that produced the first NaN/Inf (nan_watch.py says how).

args: target (required), calls, timeout.
The process-wide anomaly flags are saved before each call and restored right after it, in the
calling thread, whatever ends the call or the request (limit, timeout, cancel, disconnect,
detach): a call still running when the request ends restores them itself when it returns, and
until then no other ``torch anomaly`` may start (it would save the borrowed state as "previous").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .. import call_window, graph_cost, nan_watch
from ..protocol import ERR_FAILED, ERR_USAGE
from ..registry import CommandError, Context
from ..torch_support import get_torch


class _Window:
    """Per-request state shared by the target's thread (start/stop) and the handler."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.watch = nan_watch.make_watch(torch)
        self.saved: dict[int, nan_watch.AnomalyState] = {}
        self.lock = threading.Lock()
        self.in_flight = 0
        self.handler_done = False
        self.durations: list[float] = []
        self._t0 = 0.0

    def start(self, index: int) -> None:
        state = nan_watch.AnomalyState(self.torch)
        self.watch.call = index
        self.watch.__enter__()
        try:
            self.torch.set_anomaly_enabled(True, False)
        except BaseException:
            self.watch.__exit__(None, None, None)
            raise
        with self.lock:
            self.saved[index] = state
            self.in_flight += 1
        self._t0 = time.perf_counter()

    def stop(self, index: int) -> None:
        self.durations.append(time.perf_counter() - self._t0)
        try:
            self.watch.__exit__(None, None, None)
        finally:
            with self.lock:
                state = self.saved.pop(index, None)
                self.in_flight -= 1
                release = self.handler_done and self.in_flight == 0
            if state is not None:
                state.restore()
            if release:
                nan_watch.BUSY.release()

    def finish(self) -> None:
        """The handler is done: the lock is released now, or by the last call in flight."""
        with self.lock:
            self.handler_done = True
            release = self.in_flight == 0
        if release:
            nan_watch.BUSY.release()


def handle_anomaly(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    spec = ctx.arg("target")
    if not isinstance(spec, dict):
        raise CommandError("torch anomaly needs `module [class] method`",
                           "e.g. `torch anomaly __main__ train_step -n 1`", ERR_USAGE)
    calls = int(ctx.arg("calls", 1) or 1)
    timeout = float(ctx.arg("timeout", 60.0) or 60.0)
    if graph_cost.suspends(spec):
        raise CommandError("torch anomaly cannot watch a generator or coroutine method",
                           "its calls span suspensions during which other code runs; name the "
                           "function it calls for each step instead", ERR_USAGE)
    if not hasattr(torch, "set_anomaly_enabled"):
        raise CommandError("this torch has no torch.set_anomaly_enabled", "torch >= 1.10 is needed", ERR_FAILED)
    if not nan_watch.BUSY.acquire(blocking=False):
        raise CommandError("another torch anomaly is running (or its last call has not returned yet)",
                           "wait for it to end; anomaly mode is process-wide, two at once would mix states",
                           ERR_FAILED)
    before = nan_watch.read_state(torch)
    try:
        window = _Window(torch)
    except Exception as exc:
        nan_watch.BUSY.release()
        raise CommandError(f"cannot watch operators in this torch: {exc}", "", ERR_FAILED) from None
    try:
        info = call_window.record_calls(ctx, spec, calls, timeout, window.start, window.stop, what="anomaly")
    finally:
        window.finish()
    first = window.watch.first
    result: dict[str, Any] = {
        **info, "found": first is not None, "first": first,
        # where the first NaN came from inputs already non-finite: the op that made one of finite ones
        "origin": window.watch.origin,
        "anomaly_before": before, "anomaly_after": nan_watch.read_state(torch),
        "restore_pending": window.in_flight > 0,
        "call_seconds": [round(d, 4) for d in window.durations],
        "ops_checked": window.watch.ops,
    }
    if first is None:
        result["note"] = (f"no NaN/Inf appeared in {info['calls_recorded']} call(s): run more calls (-n), or "
                          "`torch grads` to see whether gradients are non-finite at all")
    return result
