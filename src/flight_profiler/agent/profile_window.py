"""``torch profile METHOD -n N --window``: one all-threads profile around a method's next calls,
long enough to hold whole training steps, whatever part of the step the method is.

A user names ``forward`` far more often than the step. The calls of ``forward`` alone show a
region of the step: its outputs are freed later by backward, its graph is used after it returns,
the DataLoader waits between its calls. So the window covers the loop itself: it runs from now
until the method has been entered N+1 times (N whole periods between entries) and every
optimizer seen has stepped at least ``STEPS_WANTED + 1`` times (whole steps between its steps,
for a method called several times a step: LBFGS's closure, gradient accumulation's
micro-batches; past ``soft`` seconds, twice), or the timeout. The method's
calls and every optimizer step are marked in the trace (step_marks.py); the report finds the
step from them and uses whole steps only.

A method whose one call holds a whole step itself (an optimizer step or a backward completes
inside it: ``train_step``, ``optimizer.step``), seen on one call watched before any profiling
(an optimizer's own ``step`` needs no call watched), is profiled one session per call instead
(``holds_a_step``): its calls are the steps, and a session in the calling thread records the
``[memory]`` events the report judges growth on.

The session runs over all threads and is started from the agent's thread. It is stopped at the
next step boundary a training thread reaches (profiler_sessions.BoundaryStop), else at the main
thread's next safe point, and from the agent's thread only when neither comes within seconds: so
it ends at the timeout, on a cancel or a lost client whatever the target does next (a session
that belongs to the target's thread could only be stopped by a later call that may never come),
but not while a training thread is inside an op.
torch records no [memory] events from such a session: memory over time comes from the censuses
and snapshots, not from this trace.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from . import hooks, targets
from .profiler_sessions import BoundaryStop, start_profiler
from .protocol import ERR_FAILED
from .registry import CommandError, Context
from .step_marks import (
    BACKWARD_SPEC,
    StepMarks,
    hook_optimizers,
    optimizer_classes,
    optimizer_step_codes,
)

# Whole steps of every optimizer the window waits for (3 points of memory or time per step are
# the least a trend is judged on); past ``soft`` seconds one whole step will do.
STEPS_WANTED = 3
DEFAULT_SOFT_S = 5.0
# How long a window whose calls are in waits for a first backward when the program has built no
# optimizer (a hand-written update steps after each backward; an inference loop never has one).
NO_STEP_WAIT_S = 1.0
# How long a window waits for an optimizer step to end while backward passes run inside one
# (closures) before it takes those backward passes as the steps (StepMarks.backward_steps): an
# LBFGS step of a few closures ends within it (the time-series model: 0.1-0.4 s); a PINN's one
# step of max_iter=50000 runs for minutes.
CLOSURE_STEPS_AFTER_S = 1.0
# How often the window looks at its marks. Its thread is profiled too (all threads), and its
# stop and export cost torch ~12 us an event: woken by every call of a character RNN's forward
# (761 in a 1.6 s window), this loop and the Event it waited on were 90,000 of the window's
# 450,000 events (a fifth of its 5.8 s stop and export). Polled, a window ends at most this late.
POLL_S = 0.02
# How long a window that has ended waits for a training thread to reach a step boundary, where
# the session is stopped in that thread (profiler_sessions.BoundaryStop); a loop in steps
# reaches one within a step. Past it (nothing trains any more), the agent's thread stops it.
BOUNDARY_WAIT_S = 2.0
BOUNDARY_WAIT_CANCELLED_S = 0.5


def stop_at_boundary(stopper: BoundaryStop, cancelled: bool, seen: bool) -> None:
    """``seen``: whether the window saw a boundary at all (a call, a backward, a step); where
    none came, none is waited for (an inference loop: the main thread's next safe point)."""
    stopper.stop(0.0 if not seen else BOUNDARY_WAIT_CANCELLED_S if cancelled else BOUNDARY_WAIT_S)


def all_threads_config(torch: Any) -> Any:
    """An experimental config that profiles every thread, or None on a torch without one."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except Exception:
        return None


def mark_optimizers(ctx: Context, torch: Any, marks: StepMarks) -> None:
    """Mark every optimizer step and backward pass while the request runs (the hooks come off
    with the request's)."""
    remove = hook_optimizers(torch, marks)
    if remove is not None:
        ctx.add_hook("optimizer step marks", remove)
    try:
        target = targets.resolve(BACKWARD_SPEC)
    except CommandError:  # a torch without torch.autograd.backward as a Python function
        return
    ctx.add_hook("backward marks", hooks.install(target, marks.on_backward_enter,
                                                 marks.on_backward_exit))


def _enough(marks: StepMarks, calls: int, elapsed: float, soft: float, trains: bool) -> bool:
    """The calls are in, and STEPS_WANTED whole steps of every optimizer; or, after ``soft``
    seconds, one whole period between calls and one whole step (a step of seconds, or a method
    called every few seconds, would make the window too long to profile and to export).

    A method called many times a step (an actor-critic's forward, once per environment step,
    hundreds per episode; a character RNN's, once per character) may have its calls in before
    any backward or optimizer step: a window of forwards alone says nothing of the step and its
    graphs look unused. So until one comes the window goes on: up to ``soft`` seconds when the
    program has built an optimizer (``trains``), else NO_STEP_WAIT_S (an inference loop has
    none to wait for). Without an optimizer stepping, backward passes are the steps; so are
    they where they run inside an optimizer's step that has not ended after
    CLOSURE_STEPS_AFTER_S (an LBFGS closure's: a step that outlasts the window)."""
    fewest = marks.fewest_steps()
    if fewest is None and not trains and marks.backwards:
        fewest = marks.backwards
    if fewest is None:
        fewest = marks.backward_steps(CLOSURE_STEPS_AFTER_S, elapsed)
    if marks.entered >= calls + 1:
        if fewest is not None:
            if fewest >= STEPS_WANTED + 1:
                return True
        elif (marks.backwards and not trains) or elapsed >= (soft if trains else min(soft, NO_STEP_WAIT_S)):
            return True
    return elapsed >= soft and marks.entered >= 2 and (fewest is None or fewest >= 2)


def builds_optimizers(torch: Any) -> bool:
    """Whether the program has built an optimizer: torch wraps a class's ``step`` (for the
    profiler's annotation) the first time one of its instances is built and marks it
    ``hooked``, so the classes say it without a walk over gc's objects."""
    return any(getattr(cls.__dict__.get("step"), "hooked", False) for cls in optimizer_classes(torch))


def holds_a_step(ctx: Context, torch: Any, target: Any, timeout: float) -> bool | None:
    """Whether one call of the method runs a whole step itself (an optimizer step or a
    backward completes inside it, in its thread), watched without profiling; None if no call
    completed within ``timeout``. Such a method (``train_step``, ``optimizer.step``) is
    profiled one session per call: its calls are steps, and a session in the calling thread
    records the ``[memory]`` events an all-threads one cannot."""
    marks = StepMarks(torch, None)
    seen: dict[str, Any] = {}
    done = threading.Event()

    def on_enter(args: Any, kwargs: Any) -> Any:
        if "thread" in seen:
            return None
        seen["thread"] = threading.get_ident()
        return (sum(marks.steps), marks.backwards)

    def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if token is None or done.is_set():
            return
        seen["held"] = sum(marks.steps) > token[0] or marks.backwards > token[1]
        done.set()

    remove = hooks.install(target, on_enter, on_exit)
    ctx.add_hook(f"probe of {target.description}", remove)
    mark_optimizers(ctx, torch, marks)
    try:
        deadline = time.monotonic() + timeout
        while not done.wait(0.05):
            if ctx.wait(0) or time.monotonic() > deadline:
                return None
    finally:
        ctx.remove_hooks()
    return bool(seen.get("held"))


def around_calls(ctx: Context, torch: Any, spec: Any, activities: list[Any], use_cuda: bool,
                 options: dict[str, bool]) -> tuple[Any, dict[str, Any]]:
    """(profiler, info), or (None, info) where a session per call is the better profile: this
    torch cannot profile all threads, or the method holds a whole step (``holds_step``)."""
    config = all_threads_config(torch)
    if config is None:
        return None, {}
    calls = int(ctx.arg("calls", 1) or 1)
    timeout = float(ctx.arg("timeout", 60.0) or 60.0)
    soft = float(ctx.arg("duration") or DEFAULT_SOFT_S)
    target = targets.resolve(spec)
    started = time.monotonic()
    # An optimizer's own step() is a step by definition: no probe call to watch. The probe
    # waited for a call to begin and end, and the first profiled call then for the next one to
    # begin: 1.5-2.5 steps (0.3-0.6 s of a style transfer's LBFGS steps) for a known answer.
    held = (True if target.code in optimizer_step_codes(torch)
            else holds_a_step(ctx, torch, target, timeout))
    if held is None:
        why = "cancelled before any call" if ctx.cancelled else f"no call of {target.description} within {timeout:g} s"
        raise CommandError(why, "is the method being called? check with `watch`; raise --timeout", ERR_FAILED)
    if held:
        return None, {"holds_step": True}
    timeout = max(1.0, timeout - (time.monotonic() - started))
    trains = builds_optimizers(torch)
    marks = StepMarks(torch, target.description)
    kwargs: dict[str, Any] = {"activities": activities, **options,
                              "experimental_config": config}
    prof = torch.profiler.profile(**kwargs)
    start_profiler(prof)  # the with_stack walk of every thread, safely (profiler_sessions.py)
    started = time.monotonic()
    timed_out = cancelled = False
    stopper = BoundaryStop(prof, torch.cuda.synchronize if use_cuda else None)
    marks.boundary = stopper.boundary
    try:
        remove = hooks.install(target, marks.on_enter, marks.on_exit)
        ctx.add_hook(f"profile window around {target.description}", remove)
        mark_optimizers(ctx, torch, marks)
        reported = -1
        while not _enough(marks, calls, time.monotonic() - started, soft, trains):
            now = time.monotonic()
            if now - started > timeout:
                timed_out = True
                break
            done = min(marks.finished, calls)
            if done != reported:
                reported = done
                ctx.emit({"event": "progress", "what": "profile", "target": target.description,
                          "calls_done": done, "calls": calls,
                          "message": f"profiling all threads around {target.description}: "
                                     f"{done} of {calls} calls"})
            if ctx.wait(POLL_S):
                cancelled = True
                break
    finally:
        window_s = time.monotonic() - started
        stopping = time.monotonic()
        try:
            stop_at_boundary(stopper, cancelled or bool(ctx.cancelled), marks.entered > 0)
        finally:
            ctx.remove_hooks()  # no new mark once the session has ended
        stop_s = time.monotonic() - stopping
    info: dict[str, Any] = {
        "target": target.description, "calls_requested": calls,
        "calls_recorded": min(marks.finished, marks.entered), "calls_entered": marks.entered,
        "optimizer_steps": marks.optimizer_steps(), "all_threads": True,
        "duration_s": round(time.monotonic() - started, 3), "window_s": round(window_s, 3),
        "stop_s": round(stop_s, 3), "timed_out": timed_out,
        "cancelled": cancelled, "stopped_in": stopper.where,
    }
    if marks.entered == 0:
        del prof
        why = "cancelled before any call" if cancelled else f"no call of {target.description} within {timeout:g} s"
        raise CommandError(why, "is the method being called? check with `watch`; raise --timeout", ERR_FAILED)
    return prof, info
