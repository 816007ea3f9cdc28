"""Name the code behind a cost: the user's Python line and the operator that were running.

GPU work is tied to its CPU launch through the CUDA correlation id (kernel / memcpy ->
cudaLaunchKernel / cudaMemcpyAsync on some thread at some time); CPU work is located directly.
Then :class:`CallerIndex` says which Python frames and operators were open there.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import Any

from flight_profiler.report.stacks import CallerIndex
from flight_profiler.report.trace_loader import RawTrace

MAX_ATTRIBUTED = 2000  # occurrences attributed per question (the longest, or a uniform sample)
NO_STACK = "(no Python stack)"
Item = tuple[int, float, float, str]  # thread key, ts, duration, what


def attribute(index: CallerIndex, items: list[Item], skip_inside: frozenset[str] = frozenset(),
              longest: bool = True, annotations: bool = False) -> list[dict[str, Any]]:
    """Group occurrences by (user's Python line, outermost operator), costliest first.

    ``longest``: attribute the longest occurrences, else a uniform sample of them. Items nested
    in an operator of ``skip_inside`` are dropped: a cudaStreamSynchronize inside aten::item is
    already counted as that .item() call."""
    if longest:
        chosen = sorted(items, key=lambda x: -x[2])[:MAX_ATTRIBUTED]
    else:
        chosen = items[:: max(1, len(items) // MAX_ATTRIBUTED)][:MAX_ATTRIBUTED]
    # A point just inside the call, so that the call's own parents are open there.
    answers = index.resolve([(key, ts + min(dur, 1e-3) if dur > 0 else ts)
                             for key, ts, dur, _ in chosen], annotations)
    groups: dict[tuple[str, str], list[float]] = {}
    for (_key, _ts, dur, what), (line, ops) in zip(chosen, answers):
        if what not in skip_inside and skip_inside.intersection(ops):
            continue
        op = ops[0] if ops else what
        g = groups.setdefault((line or NO_STACK, op), [0, 0.0])
        g[0] += 1
        g[1] += dur
    rows: list[dict[str, Any]] = [
        {"where": k[0], "operator": k[1], "count": int(v[0]), "total_us": round(v[1], 3)}
        for k, v in groups.items()]
    rows.sort(key=lambda r: (-r["total_us"], -r["count"]))
    return rows[:10]


def launches(raw: RawTrace, corrs: set[int]) -> dict[int, tuple[int, float]]:
    """correlation id -> (thread key, ts) of the CPU call that launched it."""
    where: dict[int, tuple[int, float]] = {}
    for corr, ts, tid in zip(raw.rt_corr, raw.rt_ts, raw.rt_tid):
        if corr in corrs:
            where[corr] = (tid, ts)
    return where


def attribute_gpu(raw: RawTrace, index: CallerIndex, work: list[tuple[int, float, str]],
                  longest: bool = True) -> list[dict[str, Any]]:
    """Attribute GPU work (correlation id, duration, name) to the code that launched it."""
    if not longest and len(work) > MAX_ATTRIBUTED:
        work = work[:: len(work) // MAX_ATTRIBUTED][:MAX_ATTRIBUTED]
    elif longest:
        work = sorted(work, key=lambda w: -w[1])[:MAX_ATTRIBUTED]
    where = launches(raw, {c for c, _, _ in work if c >= 0})
    items = [(where[c][0], where[c][1], dur, name) for c, dur, name in work if c in where]
    return attribute(index, items, longest=True) if items else []


def idle_after(busy: list[tuple[float, float]], times: list[float]) -> list[float]:
    """GPU idle time starting at each t (0 where the GPU is busy at t)."""
    starts = [s for s, _ in busy]
    out = []
    for t in times:
        i = bisect_right(starts, t) - 1
        if i >= 0 and busy[i][1] > t:
            out.append(0.0)
        elif i + 1 < len(busy):
            out.append(busy[i + 1][0] - t)
        else:
            out.append(0.0)
    return out


def idle_gaps(raw: RawTrace, index: CallerIndex, busy: list[tuple[float, float]],
              top: int = 5) -> list[dict[str, Any]]:
    """The longest GPU idle gaps, and what the CPU thread that ended each gap was doing."""
    gaps = heapq.nlargest(top, ((busy[i + 1][0] - busy[i][1], busy[i][1], busy[i + 1][0])
                                for i in range(len(busy) - 1)))
    if not gaps:
        return []
    ends = {g[2] for g in gaps}
    first_after: dict[float, int] = {}  # gap end -> correlation of the GPU event starting there
    for ts, corr in zip(raw.g_ts, raw.g_corr):
        if ts in ends and corr >= 0:
            first_after.setdefault(ts, corr)
    where = launches(raw, set(first_after.values()))
    points, keep = [], []
    for length, start, end in gaps:
        launch = where.get(first_after.get(end, -1))
        if launch is not None:
            points.append((launch[0], (start + end) / 2))
            keep.append((length, start, end))
    rows = []
    t0 = busy[0][0]
    for (length, start, _end), (line, ops) in zip(keep, index.resolve(points, annotations=True)):
        rows.append({"at_us": round(start - t0, 3), "idle_us": round(length, 3),
                     "cpu_was_in": ops[0] if ops else "(nothing profiled: Python or waiting)",
                     "innermost": ops[-1] if ops else None, "where": line or NO_STACK})
    return rows
