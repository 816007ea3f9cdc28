"""What the job rules (job_hang, job_straggler, job_imbalance) share: their thresholds (documented
in docs/ranks.md) and how an input is tied to a rank."""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass

from flight_profiler.report.models import Finding, InputResult

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class JobThresholds:
    # job-hang: stack samples needed before a rank counts as stuck (same stack every time).
    hang_min_samples: int = 2
    # ... and a waiting rank's thread woke up fewer times than this between its first and last
    # sample (1 s apart): measured 0 on a hung gloo rank and on a DDP rank blocked in backward;
    # a moving one wakes up at least once a step (~280 a second on a 4 ms step, ~20 on 50 ms).
    hang_moving_wakeups: int = 5
    # ... and used no more CPU than this (clock ticks, 10 ms each) meanwhile: a blocked thread
    # uses none; a backward that computes, or a loop, uses some every step.
    hang_moving_cpu_ticks: int = 2
    # job-straggler: the others wait for a rank in their collectives at least this many points
    # of their window more than it does (the median of the others' wait share minus its own) ...
    straggler_wait_gap_pct: float = 20.0
    # ... and its own work (its window minus its waits) is at least this many times theirs.
    straggler_own_ratio: float = 1.3
    # Computing longer counts as more work when the rank runs at least this many more operators
    # per step than the others (and this % more); the same operators running longer is said as
    # "slower" at info (a busy host does that: measured on this shared 2-core machine, healthy
    # ranks' steps differed by up to 2x, the planted extra metric added ~12 operators a step).
    straggler_extra_ops: float = 3.0
    straggler_extra_ops_pct: float = 5.0
    # Without traces: Flight Recorder names the rank that enqueued most collectives last when
    # its median lag behind the first rank is at least this (microseconds).
    straggler_fr_lag_us: float = 2000.0
    # Traces without the waits measured (no Python frames, no collective span): a rank's compute
    # share of its window against the median of the others'.
    straggler_ratio: float = 1.5
    # ... and from this ratio on, without the others' longer wait (gloo spans include transfers)
    straggler_clear_ratio: float = 2.5
    straggler_min_share_pct: float = 2.0  # and at least this many points of the window more
    # ... while the others spend no less of their window in collectives than it does, give or
    # take this many points (gloo's spans include transfer time, so both sides look alike).
    straggler_wait_tolerance_pct: float = 5.0
    # job-imbalance: max against median across ranks, relative and absolute.
    memory_imbalance_pct: float = 20.0
    memory_imbalance_min_bytes: int = 64 << 20
    step_imbalance_pct: float = 15.0
    # ... and the step-time difference must exceed this many pooled standard deviations.
    step_noise_sigmas: float = 3.0


JT = JobThresholds()


def rank_of(inp: InputResult) -> int | None:
    """The input's rank: recorded in the file (traces' distributedInfo, stacks files), else
    named in the file name (``snap_rank3.pickle``, ``rank-3/``, HTA's ``rank_3``)."""
    if inp.rank is not None:
        return inp.rank
    m = _RANK_IN_NAME.search(os.path.basename(inp.path)) or _RANK_IN_NAME.search(inp.path)
    return int(m.group(1)) if m else None


def by_rank(inputs: list[InputResult]) -> dict[int, list[InputResult]]:
    out: dict[int, list[InputResult]] = {}
    for inp in inputs:
        r = rank_of(inp)
        if r is not None:
            out.setdefault(r, []).append(inp)
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def missing_ranks(world_size: object, present: set[int]) -> list[int]:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size <= 0:
        return []
    if world_size > 100_000:
        return []
    return [r for r in range(world_size) if r not in present]


def tag_ranks(inputs: list[InputResult], findings: list[Finding]) -> None:
    """When the inputs come from several ranks, per-process findings (a leak on one rank...)
    get the ranks of the inputs they cite; job rules set theirs themselves."""
    rank_by_path = {i.path: rank_of(i) for i in inputs}
    if len({r for r in rank_by_path.values() if r is not None}) < 2:
        return
    for f in findings:
        if f.ranks is not None or not f.inputs:
            continue
        found = [rank_by_path.get(p) for p in f.inputs]
        if all(r is not None for r in found):
            f.ranks = sorted({r for r in found if r is not None})
