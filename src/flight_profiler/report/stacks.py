"""CPU-side nesting per thread: operators' self time, and "who called this" for a point in time.

Traces are nearly sorted by start time per thread (a handful of events out of place in 100 k),
so a thread is re-sorted only when the loader saw it out of order; Timsort makes that cheap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from flight_profiler.report.trace_loader import CPU_OP, PY_FRAME, RawTrace, ThreadIntervals

_FRAME_RE = re.compile(r"^(.*)\((\d+)\): (.*)$")
# Frames from these places are the library, not the user's code that called it.
_LIB_MARKERS = (
    "site-packages/", "dist-packages/", "torch/", "<built-in", "<frozen", "threading.py",
    "runpy.py", "contextlib.py", "functools.py", "/lib/python3", "typing.py", "abc.py",
    "flight_profiler/agent",
)


def is_user_frame(name: str) -> bool:
    m = _FRAME_RE.match(name)
    if m is None:
        return False
    path = m.group(1)
    return not any(marker in path for marker in _LIB_MARKERS)


def frame_location(name: str) -> str:
    """``train.py(57): train_step`` -> ``train.py:57 (train_step)``."""
    m = _FRAME_RE.match(name)
    if m is None:
        return name
    return f"{m.group(1)}:{m.group(2)} ({m.group(3)})"


def _order(th: ThreadIntervals) -> Sequence[int]:
    """Span indices by start time, the longer (parent) first at equal starts; cached."""
    if th.sorted:
        return range(len(th.ts))
    if th.order is None:
        # Two stable C-keyed sorts instead of one tuple key: 3x faster on a million spans.
        idx = sorted(range(len(th.ts)), key=th.end.__getitem__, reverse=True)
        idx.sort(key=th.ts.__getitem__)
        th.order = idx
    return th.order


def _open_at(stack: list[int], th: ThreadIntervals, all_names: list[str],
             t: float, annotations: bool) -> tuple[str | None, list[str]]:
    """(innermost user frame, operators outermost-first) among the open spans at t; with
    ``annotations``, record_function spans (DataLoader, Optimizer.step ...) count as operators."""
    end = th.end
    while stack and end[stack[-1]] < t:
        stack.pop()
    user: str | None = None
    ops: list[str] = []
    for j in stack:  # outermost first
        if end[j] < t:
            continue
        name = all_names[th.name[j]]
        kind = th.kind[j]
        if kind == PY_FRAME:
            if is_user_frame(name):
                user = frame_location(name)  # the innermost wins
        elif kind == CPU_OP or (annotations and not name.startswith("ProfilerStep")):
            ops.append(name)
    return user, ops


@dataclass
class CallerIndex:
    """Answers, for many (thread, time) points at once: which operators and Python frames were
    open there. One sweep per thread over its spans, queries sorted by time: O(spans + queries)."""

    raw: RawTrace

    def resolve(self, points: list[tuple[int, float]],
                annotations: bool = False) -> list[tuple[str | None, list[str]]]:
        """For each (thread key, t): (innermost user frame as file:line, operators outermost-first)."""
        answers: list[tuple[str | None, list[str]]] = [(None, [])] * len(points)
        by_thread: dict[int, list[tuple[float, int]]] = {}
        for qid, (key, t) in enumerate(points):
            by_thread.setdefault(key, []).append((t, qid))
        all_names = self.raw.names
        for key, queries in by_thread.items():
            th = self.raw.threads.get(key)
            if th is None:
                continue
            queries.sort()
            ts, end = th.ts, th.end
            stack: list[int] = []
            qi, nq = 0, len(queries)

            for i in _order(th):
                s = ts[i]
                while qi < nq and queries[qi][0] < s:
                    t, qid = queries[qi]
                    answers[qid] = _open_at(stack, th, all_names, t, annotations)
                    qi += 1
                if qi >= nq:
                    break
                while stack and end[stack[-1]] <= s:
                    stack.pop()
                stack.append(i)
            while qi < nq:
                t, qid = queries[qi]
                answers[qid] = _open_at(stack, th, all_names, t, annotations)
                qi += 1
        return answers


def operator_self_times(
    raw: RawTrace, tiny_us: float = 0.0, max_samples: int = 0,
) -> tuple[dict[str, list[float]], list[tuple[int, float, float, str]]]:
    """name -> [calls, total us, self us] for cpu_op events (self = minus nested cpu_ops), and
    up to ``max_samples`` (thread, ts, self us, name) of operators whose self time < tiny_us."""
    stats: dict[str, list[float]] = {}
    tiny: list[tuple[int, float, float, str]] = []
    names = raw.names
    for key, th in raw.threads.items():
        ts, end, nm, kind = th.ts, th.end, th.name, th.kind
        stack: list[list[float]] = []  # [end, name id, duration, children, start]

        def close(item: list[float], key: int = key) -> None:
            name = names[int(item[1])]
            s = stats.get(name)
            self_us = item[2] - item[3]
            if self_us < 0:
                self_us = 0.0
            if s is None:
                stats[name] = [1, item[2], self_us]
            else:
                s[0] += 1
                s[1] += item[2]
                s[2] += self_us
            if self_us < tiny_us and len(tiny) < max_samples:
                tiny.append((key, item[4], self_us, name))

        for i in _order(th):
            if kind[i] != CPU_OP:
                continue
            t0 = ts[i]
            while stack and stack[-1][0] <= t0:
                close(stack.pop())
            dur = end[i] - t0
            if stack:
                stack[-1][3] += dur
            stack.append([end[i], nm[i], dur, 0.0, t0])
        while stack:
            close(stack.pop())
    return stats, tiny
