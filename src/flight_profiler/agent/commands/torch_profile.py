"""``torch profile``: a method's next calls (in the calling thread), a time window (all
threads), or a window around a method's next calls (all threads: the whole steps the calls run
in), with torch.profiler, written as a Chrome trace; returns the top operators.

args: target (method mode) or duration (window mode) or both with ``window`` (around mode);
calls, timeout, path/default_dir, record_shapes, profile_memory, with_stack, sort_by, row_limit,
schedule [wait, warmup, active, repeat], tensorboard (a directory), label, budget (seconds: in
method mode, no further call once the profiled calls took that long, sessions' stops included).
CPU activity always; CUDA activity when the target uses CUDA (synchronised before stopping).

Windows carry step marks (agent/step_marks.py): each optimizer's steps and, around a method,
its calls, so that the report can find the step whatever method was named. An all-threads
session is started by the agent's thread and ends whatever the target does: at the next step
boundary of a training thread, in that thread, else at the main thread's next safe point, else
from the agent's thread (profiler_sessions.BoundaryStop). The per-call sessions of method mode
belong to the calling thread (call_window.py). An all-threads session's price is that torch
records no [memory] events from it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from .. import call_window, profile_window, targets, trace_tools
from ..profiler_sessions import BoundaryStop, PerCall, schedule_roles, start_profiler
from ..protocol import ERR_FAILED, ERR_USAGE
from ..registry import CommandError, Context
from ..step_marks import CALL_MARK, NAMED_STEP, OPTIMIZER_MARK, StepMarks
from ..torch_support import (
    check_writable,
    cuda_in_use,
    file_result,
    get_torch,
    output_path,
    profiler_warnings,
)


def handle_profile(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    duration = ctx.arg("duration")
    spec = ctx.arg("target")
    around = bool(ctx.arg("window"))
    if around and spec is None:
        raise CommandError("torch profile --window needs `module [class] method`",
                           "e.g. `torch profile __main__ Model forward -n 10 --window`", ERR_USAGE)
    if not around and (duration is None) == (spec is None):
        raise CommandError("torch profile needs either `module [class] method` or --duration",
                           "e.g. `torch profile __main__ train_step -n 3` or `torch profile --duration 5`",
                           ERR_USAGE)
    path = _path(ctx)
    check_writable(path)
    profiler_warnings()  # earlier sessions' (a slow trigger's) are not this answer's
    use_cuda = cuda_in_use(torch)
    sort_by = str(ctx.arg("sort_by") or ("self_cuda" if use_cuda else "self_cpu"))
    if sort_by not in trace_tools.SORT_KEYS:
        raise CommandError(f"unknown sort key {sort_by!r}", "one of " + ", ".join(trace_tools.SORT_KEYS), ERR_USAGE)
    options = {
        "record_shapes": bool(ctx.arg("record_shapes")),
        "profile_memory": bool(ctx.arg("profile_memory")),
        "with_stack": bool(ctx.arg("with_stack")),
    }
    if around:
        prof, info = profile_window.around_calls(ctx, torch, spec, _activities(torch, use_cuda),
                                                 use_cuda, options)
        if prof is None:  # the method is the step, or no all-threads profiling: per call
            held = bool(info.get("holds_step"))
            # On CUDA one warm-up call first (its session pays CUPTI's start-up), then a
            # ProfilerStep each. On CPU the first session starts in 1-4 ms (inductor left
            # alone, profiler_sessions.py) and times its step as the next ones do (bench/
            # bench_first_session.py): a warm-up call there is one whole step more,
            # 2.5 s of a 28 s diagnosis of a style-transfer LBFGS step.
            warmup = WARMUP_CALLS_CUDA if use_cuda else 0
            calls = int(ctx.arg("calls", 1) or 1)
            prof, info = _method(ctx, torch, spec, use_cuda, options,
                                 schedule_roles(0, warmup, calls, 1),
                                 export_dir=os.path.dirname(path) or ".")
            info["holds_step"] = held
            info["warmup_calls"] = warmup
            info["note"] = ("each call holds a whole step (an optimizer step or a backward): one "
                            f"session per call, {warmup} warm-up call(s)" if held else
                            "this torch cannot profile all threads (no profile_all_threads): the "
                            "calls only, one session each")
    elif duration is not None:
        steps = ctx.arg("steps")
        prof, info = _window(ctx, torch, float(duration), use_cuda, options,
                             int(steps) if steps else None)
    else:
        prof, info = _method(ctx, torch, spec, use_cuda, options,
                             export_dir=os.path.dirname(path) or ".")
    name = ctx.arg("label") or f"flight_profiler pid {os.getpid()} {info.get('target', 'window')}"
    notes: list[str] = []
    rows = ctx.arg("row_limit")
    rows = 15 if rows is None else int(rows)
    exporting = time.monotonic()
    try:
        size, trace = trace_tools.export(prof if isinstance(prof, list) else [prof], path, str(name),
                                         notes, parse=rows > 0)
    finally:
        del prof
    info["export_s"] = round(time.monotonic() - exporting, 3)
    if trace is None and rows <= 0:
        table = None
    elif trace is None:
        table = None
        earlier = f"{info['note']}; " if info.get("note") else ""
        info["note"] = earlier + (f"the trace is {size / 2**20:.0f} MiB compressed: its top operators were not "
                        "computed inside this process (parsing it here would take about 10x its "
                        f"uncompressed size in memory); `flight_profiler report {path}` lists them")
    else:
        table = trace_tools.top_ops(trace, sort_by, rows)
    del trace
    if notes:
        info["note"] = "; ".join(([info["note"]] if info.get("note") else []) + notes)
    warned = profiler_warnings()
    if warned:
        earlier = f"{info['note']}; " if info.get("note") else ""
        info["note"] = earlier + ("torch's profiler warned (kept out of the target's stderr; an "
                                  "operator in flight when the session started or stopped is cut "
                                  "short in the trace): " + "; ".join(warned))
    mode = "around" if around and info.get("all_threads") else "window" if duration is not None and not around else "method"
    return {**file_result(path, size), "mode": mode,
            "cuda": use_cuda, **info, "top_ops": table}


def _path(ctx: Context) -> str:
    tb = ctx.arg("tensorboard")
    if not tb:
        return output_path(ctx.args, "profile", "pt.trace.json.gz")
    # The layout TensorBoard's profiler plugin reads: DIR/plugins/profile/<run>/<host>_<pid>.<ts>.pt.trace.json.gz
    run = str(ctx.arg("label") or time.strftime("%Y%m%d-%H%M%S"))
    directory = os.path.join(str(tb), "plugins", "profile", run.replace("/", "_"))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot create {directory}: {exc.strerror}", "pass another --tensorboard", ERR_USAGE) from None
    name = f"{socket.gethostname()}_{os.getpid()}.{int(time.time() * 1000)}.pt.trace.json.gz"
    return os.path.join(directory, name)


def _activities(torch: Any, use_cuda: bool) -> list[Any]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if use_cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _schedule(ctx: Context) -> list[str] | None:
    raw = ctx.arg("schedule")
    if not raw:
        return None
    try:
        parts = [int(x) for x in raw]
        wait, warmup, active = parts[:3]
        repeat = parts[3] if len(parts) > 3 else 1
    except (TypeError, ValueError):
        raise CommandError(f"bad --schedule {raw!r}", "use wait,warmup,active[,repeat], e.g. 1,1,3", ERR_USAGE) from None
    if min(wait, warmup) < 0 or active < 1 or repeat < 1:
        raise CommandError(f"bad --schedule {raw!r}", "active >= 1, repeat >= 1, others >= 0", ERR_USAGE)
    return schedule_roles(wait, warmup, active, repeat)


def _method(ctx: Context, torch: Any, spec: Any, use_cuda: bool, options: dict[str, bool],
            roles: list[str] | None = None, export_dir: str | None = None,
            ) -> tuple[Any, dict[str, Any]]:
    if not isinstance(spec, dict):
        raise CommandError("torch profile needs `module [class] method`", "", ERR_USAGE)
    calls = int(ctx.arg("calls", 1) or 1)
    timeout = float(ctx.arg("timeout", 60.0) or 60.0)
    roles = _schedule(ctx) if roles is None else roles
    if roles is not None:
        calls = len(roles)
    target = targets.resolve(spec)
    # Marked calls and optimizer steps: the report tells a method that is the step from one
    # that runs inside it (whose calls are no steps: their memory and graphs live on after them).
    step_marks = StepMarks(torch, None)
    profile_window.mark_optimizers(ctx, torch, step_marks)
    marks = [f"{CALL_MARK}{target.description}"]
    if target.code in step_marks.step_codes:
        # An optimizer's own step() (LBFGS.step with its closure): torch's post-hook marks the
        # step after the hooked code returns, outside the call's session, so the call says it.
        marks.append(f"{OPTIMIZER_MARK}{NAMED_STEP} {target.description.split('.')[-2]}")
    per_call = PerCall(torch, {"activities": _activities(torch, use_cuda), **options}, roles,
                       steps=roles is not None, sync_cuda=use_cuda, marks=marks,
                       export_dir=export_dir)
    budget = float(ctx.arg("budget") or 0.0)
    # Within a budget, the calls up to the 2nd profiled one at least (a warm-up or wait call is
    # not profiled).
    active = [i for i in range(calls) if per_call.role(i) == "active"]
    least = (active[call_window.MIN_CALLS_IN_BUDGET - 1] + 1
             if len(active) >= call_window.MIN_CALLS_IN_BUDGET else calls)
    try:
        info = call_window.record_calls(ctx, spec, calls, timeout, per_call.start, per_call.stop,
                                        what="profile", budget=budget, least=least)
    finally:
        profs = per_call.finish()
    if not profs:
        raise CommandError("no profiled call completed (only wait/warmup calls ran)",
                           "raise --timeout or use a shorter --schedule", ERR_FAILED)
    if roles is not None and ctx.arg("schedule"):
        info["schedule"] = list(ctx.arg("schedule"))
    info["sessions"] = len(profs)
    return profs, info


WARMUP_CALLS_CUDA = 1
# A window cut by --steps lasts this long at least: a job stepping 450 times a second would
# otherwise give a window of a few milliseconds, too short for what the loop does between steps.
STEPS_MIN_WINDOW_S = 1.0
STEPS_POLL_S = 0.05


def _window(ctx: Context, torch: Any, duration: float, use_cuda: bool, options: dict[str, bool],
            steps: int | None = None) -> tuple[Any, dict[str, Any]]:
    """All threads for ``duration`` s; with ``steps``, less once every optimizer stepped that many
    times, or, in a program that built none, once that many backward passes ran, as also where
    they run inside an optimizer step that has not ended (an LBFGS closure's). (The same
    session ends sooner: a second, shorter session to measure the job's rate
    first was tried, and torch crashed in its stop with back-to-back all-threads sessions.)"""
    if not 0 < duration <= 3600:
        raise CommandError(f"--duration {duration:g} is out of range", "0 < seconds <= 3600", ERR_USAGE)
    kwargs: dict[str, Any] = {"activities": _activities(torch, use_cuda), **options}
    all_threads = False
    try:
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        all_threads = True
    except Exception:  # older torch: only the agent's thread would be seen
        pass
    prof = torch.profiler.profile(**kwargs)
    start_profiler(prof)
    started = time.monotonic()
    cancelled = False
    ended_by_steps = False
    marks = StepMarks(torch, None)
    # Stopped where a training thread reaches a backward or an optimizer step, in that thread
    # (profiler_sessions.BoundaryStop): stopped from here while it was inside an op, a session
    # crashed the target.
    stopper = BoundaryStop(prof, torch.cuda.synchronize if use_cuda else None)
    marks.boundary = stopper.boundary
    try:
        profile_window.mark_optimizers(ctx, torch, marks)
        # Without an optimizer (a hand-written update), backward passes are the steps.
        trains = steps is not None and profile_window.builds_optimizers(torch)
        told = 0.0
        while True:
            elapsed = time.monotonic() - started
            left = duration - elapsed
            if left <= 0:
                break
            if steps is not None and elapsed >= STEPS_MIN_WINDOW_S:
                fewest = marks.fewest_steps() if trains else marks.backwards
                if fewest is None:  # backward passes in an optimizer step that has not ended
                    fewest = marks.backward_steps(STEPS_MIN_WINDOW_S, elapsed)
                if (fewest or 0) >= steps:
                    ended_by_steps = True
                    break
            if elapsed >= told:
                told = elapsed + 1.0
                ctx.emit({"event": "progress", "what": "profile",
                          "message": f"profiling all threads: {left:.0f} s left"})
            if ctx.wait(min(STEPS_POLL_S if steps is not None else 1.0, left)):
                cancelled = True
                break
    finally:
        window_s = time.monotonic() - started
        try:
            profile_window.stop_at_boundary(stopper, cancelled or bool(ctx.cancelled),
                                            bool(marks.backwards or marks.fewest_steps()))
        finally:
            ctx.remove_hooks()
    # duration_s takes in the stop (seconds for a dense window: torch's post-processing), so the
    # window's own span, which its steps' rate is measured on, is given apart.
    info: dict[str, Any] = {"duration_s": round(time.monotonic() - started, 3),
                            "window_s": round(window_s, 3), "all_threads": all_threads,
                            "cancelled": cancelled, "stopped_in": stopper.where,
                            "optimizer_steps": marks.optimizer_steps(),
                            "optimizer_classes": marks.optimizer_classes()}
    if ended_by_steps:
        info["ended_by_steps"] = steps
    if not all_threads:
        info["note"] = "this torch cannot profile other threads (no profile_all_threads): the trace is mostly empty"
    return prof, info
