"""The step model: which span of a trace is one training (or serving) step, and where the named
method sits in it. Every figure the rules give "per step" is taken over whole steps only.

A user names ``forward`` more often than the step. A forward is a region of the step: its
outputs are freed by the backward after it returns, its graph is consumed there, the loop waits
for data between its calls. Judged per call, every healthy loop "leaks" and "never runs a
backward". So the step is found from the trace, in this order:

1. ``ProfilerStep#N`` annotations (torch.profiler's schedule, or the agent's per-call sessions).
   When they wrap calls of a method (the agent's ``flight_profiler.call#`` mark inside them)
   that is not the step itself, the model says so: the calls are a region, not steps.
2. The optimizer: the agent's per-optimizer marks (``flight_profiler.optimizer_step#K``; a
   named optimizer step, ``LBFGS.step``, has ``#named`` around each call: torch's post-hook runs
   after the hooked code returns, outside the call's session), else
   torch's ``Optimizer.step#Class.step`` annotations. With several optimizers (a GAN's two) the
   one that steps least often marks the step; the step ends where its ``step()`` ends.
3. ``torch.autograd.backward`` calls (the agent's ``flight_profiler.backward`` marks, else
   Python frames with ``with_stack``): a loop without an optimizer object (a hand-written SGD
   update) steps once per backward.
4. The named method's calls (the agent's marks): an inference loop's request handler.
5. Otherwise the whole trace is one window.

The step's boundaries ``b0 < b1 < ... < bk`` give k whole steps; what lies before ``b0`` and
after ``bk`` was cut by the window's edges and is left out of every per-step figure.

The named method is then placed: calls per step, and "the step" when each of its calls holds
exactly one boundary (a ``train_step`` that calls ``optimizer.step()``): the steps are then its
calls, entry to entry, so that the time between calls (the DataLoader wait) belongs to a step.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flight_profiler.report.trace_loader import RawTrace

CALL_MARK = "flight_profiler.call#"
OPTIMIZER_MARK = "flight_profiler.optimizer_step#"
BACKWARD_MARK = "flight_profiler.backward"
TORCH_OPTIMIZER = "Optimizer.step#"
NAMED_STEP = "named"  # the agent's mark around each call of a named optimizer step
MIN_BOUNDARIES = 2  # one whole step
_Item = TypeVar("_Item", bound=tuple[Any, ...])


@dataclass
class StepModel:
    """The steps of one trace and where the named method sits in them (plain data)."""

    kind: str  # profiler_step | optimizer | backward | method | window
    name: str  # what marks a step: "ProfilerStep", "AdamW.step", "backward()", the method
    how: str  # one sentence: how the step was found
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (number, ts, dur) whole
    # The method's calls are ProfilerSteps but no steps of the loop: per-step growth across
    # them means nothing (outputs and graphs live on after each call).
    region: bool = False
    # Each step is its own profiler session (one per call of the named method): c10's CPU
    # memory reporter misses the frees made between sessions, so a CPU total rises across them
    # (2 MiB a step on a healthy LBFGS loop) and per-step CPU growth is not judged.
    sessions: bool = False
    method: dict[str, Any] | None = None
    cut_us: float = 0.0  # trace time outside whole steps (the window's edges)

    @property
    def span(self) -> tuple[float, float] | None:
        """(start, end) of the whole steps, None without steps."""
        if not self.steps:
            return None
        return self.steps[0][1], self.steps[-1][1] + self.steps[-1][2]

    @property
    def contiguous(self) -> bool:
        """Steps that follow each other (boundaries), not separate sessions (ProfilerSteps)."""
        return self.kind in ("optimizer", "backward", "method")

    def per_second(self) -> float | None:
        durs = [d for _, _, d in self.steps]
        if not durs:
            return None
        median = statistics.median(durs)
        return round(1e6 / median, 3) if median > 0 else None

    def to_dict(self) -> dict[str, Any]:
        durs = [d for _, _, d in self.steps]
        return {
            "kind": self.kind, "name": self.name, "how": self.how, "whole_steps": len(self.steps),
            "median_us": round(statistics.median(durs), 3) if durs else None,
            "steps_per_s": self.per_second(), "region": self.region,
            "sessions": self.sessions, "method": self.method,
            "cut_us": round(self.cut_us, 3),
        }


def _marks(raw: RawTrace, prefix: str) -> list[tuple[int, float, float, str]]:
    return sorted((m for m in raw.marks if m[3].startswith(prefix)), key=lambda m: m[1])


def _busiest(items: list[_Item]) -> list[_Item]:
    """The items of the thread that has most of them (a step is one thread's loop)."""
    counts: dict[int, int] = {}
    for it in items:
        counts[it[0]] = counts.get(it[0], 0) + 1
    if not counts:
        return []
    key = max(counts, key=lambda k: counts[k])
    return [it for it in items if it[0] == key]


def _optimizer_boundaries(raw: RawTrace) -> tuple[list[float], str, str] | None:
    """Ends of the least frequent optimizer's steps, its name, and how it was chosen."""
    groups: dict[str, list[float]] = {}
    agent = _marks(raw, OPTIMIZER_MARK)
    source = agent or _marks(raw, TORCH_OPTIMIZER)
    for _key, ts, dur, name in source:
        groups.setdefault(name, []).append(ts + dur)
    groups = {k: v for k, v in groups.items() if len(v) >= 1}
    if not groups:
        return None
    # Least frequent first; ties: the first seen (the agent numbers optimizers in that order).
    name = min(groups, key=lambda k: (len(groups[k]), groups[k][0]))
    ends = sorted(groups[name])
    if agent:
        number, _, cls = name[len(OPTIMIZER_MARK):].partition(" ")
        label = f"{cls}.step"
        which = ("the named method, an optimizer's step()" if number == NAMED_STEP
                 else f"optimizer #{number}")
        how = (f"each step ends with {label} ({which}"
               + (f", the one that steps least often of {len(groups)}" if len(groups) > 1 else "")
               + ")")
    else:
        label = name[len(TORCH_OPTIMIZER):]
        how = f"each step ends with {label} (torch's Optimizer.step annotation)"
        if len(groups) > 1:
            how += f"; of {len(groups)} optimizer classes, the one that steps least often"
    return ends, label, how


def _calls(raw: RawTrace) -> tuple[str, list[tuple[float, float]]] | None:
    """The named method (from the agent's marks) and its calls (ts, end), outermost only."""
    marks = _marks(raw, CALL_MARK)
    if not marks:
        return None
    marks = _busiest(marks)
    label = marks[0][3][len(CALL_MARK):]
    out: list[tuple[float, float]] = []
    for _key, ts, dur, _name in marks:
        if out and ts < out[-1][1]:
            continue  # a recursive call inside the previous one
        out.append((ts, ts + dur))
    return label, out


def _short(label: str) -> str:
    """``__main__.Sequence.forward`` -> ``Sequence.forward``."""
    parts = label.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else label


def _whole(bounds: list[float]) -> list[tuple[int, float, float]]:
    return [(i, a, b - a) for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a]


def _place(calls: list[tuple[float, float]], bounds: list[float], label: str) -> dict[str, Any]:
    """How many calls per whole step, and whether each call holds exactly one boundary."""
    per_step = [bisect_left([c[0] for c in calls], b) - bisect_left([c[0] for c in calls], a)
                for a, b in zip(bounds, bounds[1:])]
    starts = [c[0] for c in calls]
    holding = [bisect_right(bounds, e) - bisect_left(bounds, s) for s, e in calls]
    inner = [h for (s, _e), h in zip(calls, holding) if bounds and bounds[0] <= s <= bounds[-1]]
    is_step = bool(inner) and all(h == 1 for h in inner) and len(calls) >= MIN_BOUNDARIES
    median = statistics.median(per_step) if per_step else None
    if is_step:
        role = "the step"
    elif median is not None and median >= 1:
        role = "inside the step"
    elif median is not None:
        role = "outside the steps" if not any(per_step) else "spans several steps"
    else:
        role = "unknown"
    return {"name": _short(label), "target": label, "calls": len(starts),
            "calls_per_step": median, "role": role}


def _window_calls(raw: RawTrace) -> str | None:
    """The method a trace of per-call sessions observed (its ProfilerSteps wrap those calls)."""
    found = _calls(raw)
    return found[0] if found else None


def _trace_span(raw: RawTrace) -> tuple[float, float]:
    if raw.trace_window is not None:
        return raw.trace_window
    return (raw.span_ts, raw.span_end) if raw.span_end > raw.span_ts else (0.0, 0.0)


def _contiguous(kind: str, name: str, how: str, bounds: list[float], raw: RawTrace,
                method: dict[str, Any] | None) -> StepModel:
    steps = _whole(bounds)
    t0, t1 = _trace_span(raw)
    cut = max(0.0, (t1 - t0) - (bounds[-1] - bounds[0])) if steps else 0.0
    return StepModel(kind, name, how, steps, method=method, cut_us=cut)


def find_steps(raw: RawTrace) -> StepModel:
    """The step model of ``raw`` (see the module docstring for the order of the evidence)."""
    calls = _calls(raw)
    if raw.steps:
        steps = sorted(raw.steps, key=lambda s: s[1])
        label = _window_calls(raw)
        if label is None:
            return StepModel("profiler_step", "ProfilerStep",
                             "ProfilerStep annotations (torch.profiler's schedule)", steps)
        # The agent's per-call sessions: a ProfilerStep per call of the method.
        inside = _optimizer_boundaries(raw) or _backward_boundaries(raw)
        has_step = inside is not None and _each_holds_one(steps, inside[0])
        method: dict[str, Any] = {"name": _short(label), "target": label, "calls": len(steps),
                  "calls_per_step": 1.0 if has_step else None,
                  "role": "the step" if has_step else "a region of the step (its calls only)"}
        runs = ("; each call is an optimizer's step()" if inside and inside[1] == _short(label)
                else "; each call runs one " + inside[1] if inside else "")
        how = (f"one profiled call of {_short(label)} per ProfilerStep"
               + (runs if has_step else
                  ": the calls hold no optimizer step or backward, so they are a region of the "
                  "step, not steps (growth and graphs across them are not judged per step)"))
        return StepModel("profiler_step", _short(label), how, steps, region=not has_step,
                         sessions=True, method=method)
    found = _optimizer_boundaries(raw)
    kind = "optimizer"
    if found is None:
        found = _backward_boundaries(raw)
        kind = "backward"
    if found is not None and len(found[0]) >= MIN_BOUNDARIES:
        bounds, name, how = found
        placed = _place(calls[1], bounds, calls[0]) if calls else None
        if placed is not None and calls is not None and placed["role"] == "the step":
            # The method is the step: its calls, entry to entry, are the steps.
            entries = [s for s, _ in calls[1]]
            how = f"each call of {placed['name']} runs one {name}: the steps are its calls"
            return _contiguous("method", placed["name"], how, entries, raw, placed)
        return _contiguous(kind, name, how, bounds, raw, placed)
    if calls is not None and len(calls[1]) >= MIN_BOUNDARIES:
        label, spans = calls
        entries = [s for s, _ in spans]
        method = {"name": _short(label), "target": label, "calls": len(spans),
                  "calls_per_step": 1.0, "role": "the step"}
        how = (f"no optimizer step or backward in the trace: one call of {_short(label)} per "
               "step, entry to entry")
        return _contiguous("method", _short(label), how, entries, raw, method)
    why = "no ProfilerStep, optimizer step, backward or marked call repeats in the trace"
    return StepModel("window", "the trace", why + ": the whole trace is one window",
                     method=({"name": _short(calls[0]), "target": calls[0], "calls": len(calls[1]),
                              "calls_per_step": None, "role": "unknown"} if calls else None))


def _backward_boundaries(raw: RawTrace) -> tuple[list[float], str, str] | None:
    """Ends of the outermost backward() calls of the thread that runs most of them (the
    agent's marks, else torch.autograd.backward's Python frames)."""
    marked = [(k, ts, dur) for k, ts, dur, _ in _marks(raw, BACKWARD_MARK)]
    calls = sorted(_busiest(marked or raw.backwards), key=lambda b: b[1])
    ends: list[float] = []
    last_end = float("-inf")
    for _key, ts, dur in calls:
        if ts < last_end:
            continue  # nested (torch.autograd.backward inside Tensor.backward)
        ends.append(ts + dur)
        last_end = ts + dur
    if not ends:
        return None
    return ends, "backward()", "no optimizer step in the trace: each step ends with a backward()"


def _each_holds_one(steps: list[tuple[int, float, float]], bounds: list[float]) -> bool:
    return bool(steps) and all(
        bisect_right(bounds, ts + dur) - bisect_left(bounds, ts) == 1 for _, ts, dur in steps)
