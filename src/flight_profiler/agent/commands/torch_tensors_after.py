"""``torch tensors module [class] method``: the census taken right after the method's next call
returns, in the thread that made the call, with every other thread held (thread_gate).

Why: a census taken at any moment catches the step wherever it is. Inside a running
``forward()``, its locals hold this call's half-built state (``outputs`` being filled, a
``hidden`` that the caller's loop will get back), and they would be charged the graph that the
loop's own variables carry, or be called a leak. Right after the method returns, its frame is
gone, the caller's loop is where it is at every step, and every census of the series sees the
program at the same point of its step. The value the call returned (not yet bound by the
caller) is walked as a root of its own: ``RNNModel.forward() return[1][0]``.

The thread that called the method is at a safe point there: it is running our hook's Python
code, not inside a torch op. Other threads are held as for any census (safepoint.py); where
that is impossible (CPython 3.14 away from the main thread, a torch profiler running) the
handler falls back to the usual safe-point census and says so.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from .. import hooks, step_marks, targets, thread_gate
from ..registry import Context
from ..safepoint import _torch_profiler_running

Take = Callable[[list[tuple[str, Any]], str], dict[str, Any]]


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claimed = False
        self.closed = False
        self.done = threading.Event()
        self.doc: dict[str, Any] | None = None
        self.why = ""


def returned_label(description: str) -> str:
    """``__main__.RNNModel.forward`` -> ``RNNModel.forward() return``."""
    name = description[len("__main__."):] if description.startswith("__main__.") else description
    return f"{name}() return"


def census_after_call(ctx: Context, spec: dict[str, Any], take: Take, timeout: float,
                      budget: float) -> tuple[dict[str, Any] | None, str]:
    """(the census, "") once the next call of ``spec`` returned, or (None, why not).
    ``budget``: the census's own time budget (a started census is waited for that long)."""
    target = targets.resolve(spec)
    state = _State()
    label = returned_label(target.description)
    moment = f"right after {target.description} returned"

    def after(roots: list[tuple[str, Any]]) -> None:
        with state.lock:
            if state.claimed or state.closed:
                return
            state.claimed = True
        try:
            if thread_gate.supported() and not _torch_profiler_running():
                state.doc = thread_gate.run_with_threads_held(lambda: take(roots, moment), 2.0)
            elif threading.current_thread() is threading.main_thread():
                state.doc = take(roots, moment)  # nothing can hold the others: as safepoint does
            else:
                state.why = "other threads cannot be held from this thread here"
        except thread_gate.GateTimeout as err:
            state.why = str(err)
        except Exception as err:  # never into the target's call
            state.why = f"{type(err).__name__}: {err}"
        finally:
            roots.clear()
            state.done.set()

    def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if exc is None:  # a call that raised is no step boundary: wait for the next one
            after([(label, value)])

    # An optimizer's own step (LBFGS.step) ends at its post-hook, the one running now included;
    # only there, so that every census of a series sees the same roots (the post-hook has no
    # return value to walk).
    remove = step_marks.after_named_step(targets.owner_class(spec), target.function,
                                         lambda: after([]))
    if remove is None:
        remove = hooks.install(target, None, on_exit)
    ctx.add_hook(f"torch tensors: census after {target.description}", remove)
    deadline = time.monotonic() + timeout
    try:
        while not state.done.is_set():
            if ctx.wait(0.05) or time.monotonic() > deadline:
                break
        with state.lock:
            state.closed = True
            claimed = state.claimed
    finally:
        remove()
    if claimed and not state.done.wait(budget + 10.0):
        return None, "the census after the call did not finish in time"
    if state.doc is not None:
        return state.doc, ""
    if not claimed:
        return None, f"{target.description} did not return within {timeout:g}s"
    return None, state.why or "the census after the call failed"
