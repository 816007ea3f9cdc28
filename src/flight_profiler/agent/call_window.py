"""Run something around a method's next N calls, in the thread that makes them.

``record_calls(ctx, spec, calls, timeout, start, stop, step)``: hooks the target (targets.resolve
+ hooks.install, registered with ctx.add_hook so it comes off however the request ends);
the first call's thread runs ``start()`` just before the body, every finished call runs
``step()``, the Nth runs ``stop()`` right after it. Other threads' calls, and recursive calls
inside a recorded one, are not counted (profilers are per thread). The handler's thread waits
with ctx.wait, streams progress events, and honours cancel and the timeout: if calls are
still running then, the recording is stopped at the end of the current call and what was
recorded so far is used. Nothing here runs in the target's threads except start/step/stop
and a few attribute updates; exceptions from them are kept for the handler, never raised
into the target.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from . import hooks, targets
from .protocol import ERR_FAILED
from .registry import CommandError, Context


class _State:
    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.started = 0
        self.finished = 0
        self.thread: int | None = None
        self.depth = 0
        self.active = False
        self.stop_requested = False
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()


def record_calls(ctx: Context, spec: dict[str, Any], calls: int, timeout: float,
                 start: Callable[[], None], stop: Callable[[], None],
                 step: Callable[[], None] | None = None, what: str = "recording") -> dict[str, Any]:
    """Returns {"calls_recorded", "target", "timed_out", "cancelled", "thread"}."""
    target = targets.resolve(spec)
    state = _State(calls)

    def finish() -> None:
        state.active = False
        try:
            stop()
        except BaseException as exc:  # kept for the handler
            state.error = exc
        state.done.set()

    def on_enter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        me = threading.get_ident()
        with state.lock:
            if state.done.is_set() or (state.stop_requested and not state.active):
                return None
            if state.thread is None:
                state.thread = me
            elif state.thread != me:
                return None
            state.depth += 1
            if state.depth > 1:
                return None  # recursion inside a recorded call
            first = not state.active
            state.active = True
            state.started += 1
        if first:
            try:
                start()
            except BaseException as exc:
                state.error = exc
                state.active = False
                state.done.set()
                return None
        return state

    def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if token is None:
            if threading.get_ident() == state.thread:
                with state.lock:
                    state.depth = max(0, state.depth - 1)
            return
        with state.lock:
            state.depth -= 1
            state.finished += 1
            last = state.finished >= state.calls or state.stop_requested
        if step is not None and not last:
            try:
                step()
            except BaseException as err:
                state.error = err
        if last and state.active:
            if step is not None:
                try:
                    step()
                except BaseException as err:
                    state.error = err
            finish()

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
    if not state.done.is_set():
        with state.lock:
            state.stop_requested = True
            running = state.active
        remove()
        if running:
            # A call is under way in the target: its end stops the recording (in its thread).
            state.done.wait(min(30.0, max(5.0, timeout)))
            if not state.done.is_set():
                raise CommandError(
                    f"{target.description} is still running its call after the "
                    f"{'cancel' if cancelled else 'timeout'}; the recording stops when it returns "
                    "and is discarded",
                    "raise --timeout so that the calls fit in it",
                    ERR_FAILED,
                )
    remove()
    if state.error is not None:
        raise CommandError(f"{what} failed in the target's thread: {state.error!r}", "", ERR_FAILED)
    if state.finished == 0:
        why = "cancelled" if cancelled else f"no call of {target.description} within {timeout:g} s"
        raise CommandError(why, "is the method being called? check with `watch`; raise --timeout",
                           ERR_FAILED)
    ctx.emit({"event": "progress", "what": what, "target": target.description,
              "calls_done": state.finished, "calls": calls,
              "message": f"recorded {state.finished} of {calls} calls of {name}"})
    return {"calls_recorded": state.finished, "calls_requested": calls, "target": target.description,
            "timed_out": timed_out, "cancelled": cancelled}
