"""Run something around each of a method's next N calls, in the thread that makes them.

``record_calls(ctx, spec, calls, timeout, start, stop)``: hooks the target (targets.resolve +
hooks.install, registered with ctx.add_hook so it comes off however the request ends); call
number i runs ``start(i)`` in its own thread just before the body and ``stop(i)`` right after
it. Only one thread's calls are recorded (the first to call), one call at a time; recursive
calls inside a recorded one are not counted.

Why a session per call rather than one spanning all N calls: a profiler belongs to the thread
that started it and can only be stopped there. If it ran between calls and the method were
never called again (or the user pressed Ctrl-C meanwhile), nothing could ever stop it: it would
record that thread forever. With one session per call, once the hook is off at most one call is
still in flight, and its own end stops its session.

The handler's thread waits with ctx.wait, streams progress events, honours cancel and the
timeout (no new call starts after them; a call in flight is waited for briefly, and otherwise
stops its session itself later, its data discarded through ``Sessions.close``). Exceptions from
start/stop are kept for the handler, never raised into the target.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

from . import hooks, targets
from .protocol import ERR_FAILED
from .registry import CommandError, Context

IN_FLIGHT_GRACE_S = 10.0


class Sessions:
    """What stop() produced, per call; closed once the handler takes it (late ones dropped)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[int, Any]] = []
        self._closed = False

    def keep(self, index: int, item: Any) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._kept.append((index, item))
            return True

    def close(self) -> list[tuple[int, Any]]:
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, []
        kept.sort(key=lambda pair: pair[0])
        return kept


# Calls recorded whatever the budget: the report compares calls, one alone says nothing of a trend.
MIN_CALLS_IN_BUDGET = 2


class _State:
    def __init__(self, calls: int, budget: float = 0.0) -> None:
        self.calls = calls
        self.budget = budget  # seconds of recorded calls (their own time and ours) before closing
        self.spent = 0.0
        self.over_budget = False
        self.entered_at = 0.0
        self.started = 0
        self.finished = 0
        self.thread: int | None = None
        self.depth = 0
        self.closed = False  # no new call may start
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()


def record_calls(ctx: Context, spec: dict[str, Any], calls: int, timeout: float,
                 start: Callable[[int], None], stop: Callable[[int], None],
                 what: str = "recording", budget: float = 0.0,
                 accept: Callable[[], bool] | None = None,
                 least: int = MIN_CALLS_IN_BUDGET) -> dict[str, Any]:
    """Returns {"calls_recorded", "calls_requested", "target", "timed_out", "cancelled",
    "in_flight"[, "budget_s"]}. ``budget`` (seconds, 0: none): once the recorded calls, with the
    recording's own start and stop, have taken that long, no further call is recorded (at
    least ``least`` are, MIN_CALLS_IN_BUDGET unless told: a profile's warm-up calls come on
    top): a step of a few ms whose recording costs 0.4 s (an actor-critic episode's backward,
    thousands of allocations with their stacks) made 10 calls 4.5 s of a diagnosis.
    ``accept`` (in the calling thread, at a call's entry): whether this call is one to
    record; the calls it turns down are not counted."""
    target = targets.resolve(spec)
    state = _State(calls, budget)

    def on_enter(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        me = threading.get_ident()
        with state.lock:
            if state.thread is not None and state.thread != me:
                return None
            if state.depth > 0:  # recursion inside a recorded call
                state.depth += 1
                return None
            if state.closed or state.started >= state.calls:
                return None
            if accept is not None and not accept():
                return None
            state.thread = me
            state.depth = 1
            index = state.started
            state.started += 1
        state.entered_at = time.monotonic()
        try:
            start(index)
        except BaseException as exc:  # kept for the handler
            state.error = exc
            with state.lock:
                state.closed = True
                state.depth = 0
            state.done.set()
            return None
        return index

    def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if token is None:
            with state.lock:
                if threading.get_ident() == state.thread and state.depth > 1:
                    state.depth -= 1
            return
        try:
            stop(token)
        except BaseException as err:
            state.error = err
        with state.lock:
            state.depth = 0
            state.finished += 1
            state.spent += time.monotonic() - state.entered_at
            if (state.budget and state.spent >= state.budget
                    and state.finished >= least and state.finished < state.calls):
                state.over_budget = state.closed = True
            last = state.finished >= state.calls or state.over_budget
        if last:
            state.done.set()

    remove = hooks.install(target, on_enter, on_exit)
    ctx.add_hook(f"{what} of {target.description} ({calls} calls)", remove)
    deadline = time.monotonic() + timeout
    reported = -1
    timed_out = cancelled = False
    name = target.description.rsplit(".", 1)[-1]
    while not state.done.is_set():
        if state.finished != reported:
            reported = state.finished
            ctx.emit({"event": "progress", "what": what, "target": target.description,
                      "calls_done": reported, "calls": calls,
                      "message": f"waiting for {name}: {reported} of {calls} calls"})
        if ctx.wait(0.1):
            cancelled = True
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
    with state.lock:
        state.closed = True
        in_flight = state.started > state.finished
    remove()
    if in_flight and not state.done.is_set():
        # Its session stops when the call returns, in its thread; wait a little for it.
        grace = time.monotonic() + min(IN_FLIGHT_GRACE_S, max(1.0, timeout))
        while state.started > state.finished and time.monotonic() < grace:
            if ctx.wait(0.05) and not cancelled:
                cancelled = True
        with state.lock:
            in_flight = state.started > state.finished
    if state.error is not None:
        raise CommandError(f"{what} failed in the target's thread: {state.error!r}", "", ERR_FAILED)
    if state.finished == 0:
        if in_flight:
            why = (f"the first call of {target.description} did not return within the "
                   f"{'cancel' if cancelled else 'timeout'}; its recording is discarded when it does")
        elif cancelled:
            why = "cancelled before any call"
        else:
            why = f"no call of {target.description} within {timeout:g} s"
        raise CommandError(why, "is the method being called? check with `watch`; raise --timeout",
                           ERR_FAILED)
    ctx.emit({"event": "progress", "what": what, "target": target.description,
              "calls_done": state.finished, "calls": calls,
              "message": f"recorded {state.finished} of {calls} calls of {name}"})
    out: dict[str, Any] = {"calls_recorded": state.finished, "calls_requested": calls,
                           "target": target.description, "timed_out": timed_out,
                           "cancelled": cancelled, "in_flight": in_flight}
    if state.over_budget:
        out["budget_s"] = budget
    return out
