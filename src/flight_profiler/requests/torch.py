"""Builders of `torch memory`, `torch tensors`, `torch profile`, `torch grads`, `torch anomaly`.

Output paths are resolved on this side (relative to the caller's cwd) and sent absolute; without
``file`` the agent names the file fp-<pid>-<kind>-<timestamp>.<ext> in this cwd
(docs/commands-torch.md). None leaves an option at the command's default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from flight_profiler.errors import BadInputFile, UsageError
from flight_profiler.requests.base import AgentRequest, Line, target_args


def _out(file: str | None) -> dict[str, Any]:
    """The path arguments every file-writing command sends."""
    if file:
        return {"path": os.path.abspath(os.path.expanduser(file))}
    return {"default_dir": os.getcwd()}


def memory(target: Sequence[str] = (), snapshot: bool = False, record: bool = False,
           record_history: str | None = None, max_entries: int | None = None,
           calls: int | None = None, file: str | None = None, timeout: float | None = None,
           label: str | None = None, budget: float | None = None) -> AgentRequest:
    """Allocator summary; ``snapshot``; ``record`` the next ``calls`` of ``target``; or
    ``record_history`` "on"/"off"."""
    chosen = [name for name, on in (("-s", snapshot), ("-r", record), ("--record-history", record_history)) if on]
    if len(chosen) > 1:
        raise UsageError(f"torch memory: {' and '.join(chosen)} cannot be combined", "pick one mode")
    if budget and not record:
        raise UsageError("torch memory: --budget is only used with -r", "e.g. `torch memory -r __main__ train_step -n 10 --budget 1.5`")
    if target and not record:
        raise UsageError("torch memory: a method is only used with -r", "e.g. `torch memory -r __main__ train_step`")
    args: dict[str, Any] = {"label": label or ""}
    if record:
        args.update(mode="record", target=target_args(target), calls=calls or 1,
                    timeout=60.0 if timeout is None else timeout, **_out(file))
        if max_entries:
            args["max_entries"] = max_entries
        if budget:
            args["budget"] = budget
    elif snapshot:
        args.update(mode="snapshot", **_out(file))
    elif record_history:
        args.update(mode="history", history=record_history, max_entries=max_entries)
    else:
        if file:
            raise UsageError("torch memory: -f needs -s or -r", "e.g. `torch memory -s -f snap.pickle`")
        args["mode"] = "summary"
    line = (Line("torch memory").flag("-s", snapshot).flag("-r", record).extend(*target)
            .option("--record-history", record_history).option("--max-entries", max_entries)
            .option("-n", calls).option("-f", file).option("--timeout", timeout)
            .option("--budget", budget).option("--label", label))
    return AgentRequest("torch memory", args, str(line))


def load_census(path: str) -> dict[str, Any]:
    """A previous census for --diff (JSON only; never a pickle)."""
    full = os.path.abspath(os.path.expanduser(path))
    try:
        with open(full, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise BadInputFile(f"cannot read {full}: {exc.strerror}", "pass a census written by `torch tensors`") from None
    except UnicodeDecodeError:
        # a pickle or a gzip given by mistake: the codec's byte offsets say nothing to the user
        raise BadInputFile(f"{full} is a binary file, not a census (census files are JSON)",
                           "pass a census written by `torch tensors`") from None
    except ValueError as exc:
        raise BadInputFile(f"{full} is not JSON: {exc}", "pass a census written by `torch tensors`") from None
    if not isinstance(doc, dict) or doc.get("format") != "flight_profiler.census":
        raise BadInputFile(f"{full} is not a flight_profiler census", "pass a file written by `torch tensors`")
    return {k: doc.get(k) for k in ("pid", "time", "label", "totals", "groups", "holders", "census_id")}


def tensors(target: Sequence[str] = (), top: int | None = None, by: str | None = None,
            diff: str | None = None, file: str | None = None, label: str | None = None,
            budget: float | None = None, timeout: float | None = None) -> AgentRequest:
    """A census of live tensors; ``diff``: a previous census file, to show what grew;
    ``target``: taken right after the method's next call returns (a step boundary), waiting
    ``timeout`` seconds for it."""
    if timeout is not None and not target:
        raise UsageError("torch tensors: --timeout needs a method", "e.g. `torch tensors __main__ train_step`")
    args: dict[str, Any] = {"top": top or 10, "by": by or "holder", "label": label or "",
                            "seconds": 5.0 if budget is None else budget, **_out(file)}
    if target:
        args.update(target=target_args(target), timeout=30.0 if timeout is None else timeout)
    if diff:
        args["previous"] = load_census(diff)
    line = (Line("torch tensors", *target).option("--top", top).option("--by", by).option("-f", file)
            .option("--diff", diff).option("--label", label).option("--budget", budget)
            .option("--timeout", timeout))
    return AgentRequest("torch tensors", args, str(line))


def schedule_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
        raise UsageError(f"bad --schedule {text!r}", "use wait,warmup,active[,repeat], e.g. 1,1,3")
    return parts


def profile(target: Sequence[str] = (), duration: float | None = None, calls: int | None = None,
            file: str | None = None, record_shapes: bool = False, profile_memory: bool = False,
            with_stack: bool = False, sort_by: str | None = None, row_limit: int | None = None,
            timeout: float | None = None, schedule: str | None = None,
            tensorboard: str | None = None, label: str | None = None,
            window: bool = False, steps: int | None = None,
            budget: float | None = None) -> AgentRequest:
    """The next ``calls`` of ``target``, or all threads for ``duration`` s, to a Chrome trace;
    ``schedule``: "wait,warmup,active[,repeat]". ``window``: all threads around the next
    ``calls`` of ``target`` (whole steps around them; ``duration``: at most this long once the
    calls are in). ``steps`` (a window without a method): end it once every optimizer stepped
    that many times, after 1 s at least. ``budget``: profiling a session per call, no further
    call once the profiled ones took that many seconds in all (2 calls at least)."""
    if steps is not None and (target or duration is None):
        raise UsageError("torch profile: --steps ends a --duration window without a method",
                         "e.g. `torch profile --duration 5 --steps 20`")
    if window and not target:
        raise UsageError("torch profile: --window needs `module [class] method`",
                         "e.g. `torch profile __main__ Model forward -n 10 --window`")
    if window and schedule:
        raise UsageError("torch profile: --window and --schedule cannot be combined",
                         "--window finds the steps itself; --schedule marks each call as one")
    if duration is not None and target and not window:
        raise UsageError("torch profile: give a method or --duration, not both",
                         "or add --window: all threads around the method's calls")
    if duration is None and not target:
        raise UsageError("torch profile: give `module [class] method` or --duration SECONDS",
                         "e.g. `torch profile __main__ train_step -n 3`")
    if tensorboard and file:
        raise UsageError("torch profile: --tensorboard and -f cannot be combined", "--tensorboard names the file itself")
    if budget is not None and not target:
        raise UsageError("torch profile: --budget bounds a method's profiled calls",
                         "e.g. `torch profile __main__ train_step -n 5 --budget 2`")
    args: dict[str, Any] = {
        "record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack,
        "sort_by": sort_by, "row_limit": 15 if row_limit is None else row_limit, "label": label or "",
        **_out(file),
    }
    if tensorboard:
        args["tensorboard"] = os.path.abspath(os.path.expanduser(tensorboard))
    if duration is not None and not window:
        if schedule:
            raise UsageError("torch profile: --schedule needs a method")
        args["duration"] = duration
        if steps is not None:
            args["steps"] = steps
    else:
        args.update(target=target_args(target), calls=calls or 1,
                    timeout=60.0 if timeout is None else timeout, schedule=schedule_list(schedule))
        if window:
            args["window"] = True
            if duration is not None:
                args["duration"] = duration
        if budget is not None:
            args["budget"] = budget
    line = (Line("torch profile", *target).flag("--window", window).option("--duration", duration)
            .option("-n", calls).option("--budget", budget)
            .option("--steps", steps).option("--schedule", schedule).option("-f", file).flag("--record-shapes", record_shapes)
            .flag("--profile-memory", profile_memory).flag("--with-stack", with_stack)
            .option("--sort-by", sort_by).option("--row-limit", row_limit).option("--timeout", timeout)
            .option("--tensorboard", tensorboard).option("--label", label))
    return AgentRequest("torch profile", args, str(line))


def grads(target: Sequence[str] = (), calls: int | None = None, interval: float | None = None,
          file: str | None = None, timeout: float | None = None, label: str | None = None) -> AgentRequest:
    """Gradient health after the next ``calls`` of ``target``, or ``calls`` measurements
    ``interval`` s apart."""
    args: dict[str, Any] = {"calls": calls or 1, "interval": 1.0 if interval is None else interval,
                            "timeout": 60.0 if timeout is None else timeout, "label": label or "",
                            **_out(file)}
    if target:
        args["target"] = target_args(target)
    line = (Line("torch grads", *target).option("-n", calls).option("-i", interval).option("-f", file)
            .option("--timeout", timeout).option("--label", label))
    return AgentRequest("torch grads", args, str(line))


def anomaly(target: Sequence[str], calls: int | None = None, timeout: float | None = None) -> AgentRequest:
    """The next ``calls`` of ``target`` under anomaly detection: the first NaN/Inf's op and line."""
    args: dict[str, Any] = {"target": target_args(target), "calls": calls or 1,
                            "timeout": 60.0 if timeout is None else timeout}
    line = Line("torch anomaly", *target).option("-n", calls).option("--timeout", timeout)
    return AgentRequest("torch anomaly", args, str(line))
