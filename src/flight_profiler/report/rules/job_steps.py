"""job-imbalance of step times: mean step times that differ across ranks beyond noise (part of
the one job verdict, job_verdict.py)."""

from __future__ import annotations

import statistics
from typing import Any

from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules.job_common import JT, by_rank, median
from flight_profiler.report.units import fmt_pct, fmt_us


def step_findings(traces: list[InputResult], figs: dict[int, dict[str, Any]]) -> list[Finding]:
    """Mean step times that differ beyond noise, when no straggler explains them (job_verdict).

    In a synchronous job (its ranks wait for each other in collectives) the steps of one window
    last equally long on every rank; different means say the traces cover different steps, and
    the slowest-step rank is not to blame unless it is also the one that waits least. Without
    waits (independent ranks), the slowest is the slowest."""
    per: dict[int, list[float]] = {}
    for r, inputs in by_rank(traces).items():
        durs = [float(x) for i in inputs for x in (i.data.get("steps") or {}).get("durations_us", [])]
        if len(durs) >= 2:
            per[r] = durs
    if len(per) < 2:
        return []
    means = {r: statistics.fmean(d) for r, d in per.items()}
    mid = median(list(means.values()))
    spread = max(means.values()) - min(means.values())
    pooled = statistics.fmean([statistics.pstdev(d) for d in per.values()])
    if mid <= 0 or 100.0 * spread / mid < JT.step_imbalance_pct or spread <= JT.step_noise_sigmas * pooled:
        return []
    slow = max(means, key=means.__getitem__)
    fast = min(means, key=means.__getitem__)
    waits = {r: float(figs[r]["wait_pct"]) for r in per if r in figs}
    synchronous = bool(waits) and max(waits.values()) >= 5.0
    blamed = [slow]
    if synchronous and min(waits, key=waits.__getitem__) != slow:
        blamed = []  # its long steps are waits for another rank, or another window
    metrics: dict[str, Any] = {"median_step_us": round(mid, 3), "spread_us": round(spread, 3),
                               "pooled_stdev_us": round(pooled, 3), "synchronous": synchronous,
                               "per_rank_mean_us": {str(r): round(m, 3) for r, m in means.items()}}
    if blamed:
        title = (f"Step time differs across ranks by {fmt_pct(100.0 * spread / mid)} "
                 f"(rank {slow} slowest, rank {fast} fastest)")
        cause = "Ranks do unequal work per step."
    else:
        title = (f"Step time differs across ranks by {fmt_pct(100.0 * spread / mid)}, but the "
                 "ranks wait for each other: the traces cover different steps")
        cause = ("In a synchronous job every rank's step lasts as long as the slowest rank's; "
                 "steps of different lengths come from traces of different moments.")
    return [Finding(
        rule="job-imbalance", severity="warning" if blamed else "info",
        title=title,
        summary=(f"Mean step: rank {slow} {fmt_us(means[slow])}, rank {fast} {fmt_us(means[fast])}, "
                 f"median {fmt_us(mid)}; the steps of one rank vary by {fmt_us(pooled)} (stdev), "
                 "so the difference is not noise."),
        evidence=[f"rank {r}: mean step {fmt_us(m)} over {len(per[r])} steps"
                  + (f", waiting for the others {fmt_pct(waits[r])} of its window" if r in waits else "")
                  for r, m in sorted(means.items())][:64],
        where=[f"rank {slow}"] if blamed else [],
        fix=["Ranks whose steps were traced at different moments compare badly: profile the same "
             "steps on every rank (`diagnose PID --all-ranks` aligns the windows, or "
             "`--all-ranks --cmd \"torch profile ... --schedule\"`)."],
        root_cause=cause,
        inputs=[p for r in (slow, fast) for p in (i.path for i in by_rank(traces)[r])],
        ranks=blamed, metrics=metrics,
    )]
