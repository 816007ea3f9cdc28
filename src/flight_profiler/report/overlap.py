"""Which part of the GPU's time each cause actually costs, from interval overlap.

A pattern costs only the time it keeps the GPU from working: collectives overlapped by compute
are free, a copy overlapped by compute is free, a sync that waits on a busy GPU is free. Each
function here takes merged, sorted ``(start, end)`` lists (``trace_metrics.merge``) and returns
microseconds.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

Intervals = Sequence[tuple[float, float]]


def covered(intervals: Intervals, cover: Intervals) -> float:
    """Length of ``intervals`` that ``cover`` overlaps (both merged and sorted)."""
    total, j, n = 0.0, 0, len(cover)
    for s, e in intervals:
        while j < n and cover[j][1] <= s:
            j += 1
        k = j
        while k < n and cover[k][0] < e:
            total += min(e, cover[k][1]) - max(s, cover[k][0])
            k += 1
    return total


def length(intervals: Intervals) -> float:
    return sum(e - s for s, e in intervals)


def exposed(intervals: Intervals, cover: Intervals) -> float:
    """Length of ``intervals`` not overlapped by ``cover``."""
    return length(intervals) - covered(intervals, cover)


def idle_after_waits(busy: Intervals, waits: Iterable[tuple[float, float]]) -> float:
    """What the CPU's waits cost the GPU: for each ``(end, duration)`` wait, the GPU idle from
    its return to the next GPU work, but no more than the wait itself; each gap counted once.

    Without the wait the CPU would have reached its next launch that much earlier, so the gap
    shrinks by at most the wait. A wait that returns while the GPU is still busy (the healthy
    GPU-bound state) costs nothing; two waits in a row end in one gap, counted once.
    """
    starts = [s for s, _ in busy]
    gaps: dict[int, float] = {}
    for t, dur in waits:
        i = bisect_right(starts, t) - 1
        if i >= 0 and busy[i][1] > t:
            continue
        if i + 1 < len(busy):
            lost = min(busy[i + 1][0] - t, dur)
            gaps[i + 1] = max(gaps.get(i + 1, 0.0), lost)
    return sum(gaps.values())


def short_gaps(busy: Intervals, below_us: float) -> tuple[float, int]:
    """Idle time in gaps shorter than ``below_us`` (launch latency), and how many."""
    total, count = 0.0, 0
    for (_, e), (s, _) in zip(busy, busy[1:]):
        gap = s - e
        if 0 < gap < below_us:
            total += gap
            count += 1
    return total, count


def idle_during(busy: Intervals, spans: Iterable[tuple[float, float]]) -> float:
    """GPU idle inside each span (the spans need not be merged)."""
    starts = [b[0] for b in busy]
    total = 0.0
    for s, e in spans:
        if e <= s:
            continue
        i = max(0, bisect_right(starts, s) - 1)
        busy_in = 0.0
        while i < len(busy) and busy[i][0] < e:
            lo, hi = max(s, busy[i][0]), min(e, busy[i][1])
            if hi > lo:
                busy_in += hi - lo
            i += 1
        total += (e - s) - busy_in
    return total
