"""job-imbalance: memory or step time that differs across ranks beyond noise.

Memory: allocated / reserved bytes per rank from memory snapshots (the latest per rank), else
the peaks of the traces' ``[memory]`` events (traces taken with profile_memory); a rank
above the median of all ranks by ``memory_imbalance_pct`` and ``memory_imbalance_min_bytes``
is flagged (it OOMs first, and every rank must fit the biggest). Step time: mean ProfilerStep
duration per rank from traces; flagged when the spread exceeds ``step_imbalance_pct`` of the
median and ``step_noise_sigmas`` pooled standard deviations of the steps themselves, and only
when no straggler explains them (one job verdict: job_verdict.py); in a synchronous job the
slowest-step rank is blamed only if it is also the one that waits least.
"""

from __future__ import annotations

from flight_profiler.rank_list import format_ranks
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.rules.job_common import JT, by_rank, median
from flight_profiler.report.rules.job_verdict import judge
from flight_profiler.report.units import fmt_bytes, fmt_pct


def _latest(inputs: list[InputResult]) -> InputResult:
    return max(inputs, key=lambda i: float(i.data.get("time") or 0.0))


def _trace_peaks(traces: list[InputResult]) -> dict[int, tuple[InputResult, dict[str, int]]]:
    """Per rank, the peak allocated / reserved of its traces' ``[memory]`` events (all devices
    of the rank summed; the highest of its traces)."""
    out: dict[int, tuple[InputResult, dict[str, int]]] = {}
    for r, inputs in by_rank(traces).items():
        best: tuple[InputResult, dict[str, int]] | None = None
        for inp in inputs:
            mem = inp.data.get("memory")
            if not isinstance(mem, dict) or not mem:
                continue
            vals = {"allocated": sum(int(d.get("peak_allocated", 0)) for d in mem.values()),
                    "reserved": sum(int(d.get("peak_reserved", 0)) for d in mem.values())}
            if best is None or vals["allocated"] > best[1]["allocated"]:
                best = (inp, vals)
        if best is not None:
            out[r] = best
    return out


def _memory(snapshots: list[InputResult], traces: list[InputResult]) -> list[Finding]:
    snaps = {r: _latest(i) for r, i in by_rank(snapshots).items()}
    source = "snapshot"
    if len(snaps) >= 2:
        per = {r: (i, {k: int(i.data.get(k) or 0) for k in ("allocated", "reserved")})
               for r, i in snaps.items()}
    else:  # no per-rank snapshots: the traces' [memory] peaks (profile_memory=True)
        per, source = _trace_peaks(traces), "trace peak"
    if len(per) < 2:
        return []
    out: list[Finding] = []
    for key in ("allocated", "reserved"):
        values = {r: v[key] for r, (_, v) in per.items()}
        mid = median([float(v) for v in values.values()])
        high = sorted(r for r, v in values.items()
                      if v - mid >= JT.memory_imbalance_min_bytes
                      and (mid <= 0 or 100.0 * (v - mid) / mid >= JT.memory_imbalance_pct))
        if not high or len(high) * 2 > len(values):
            continue
        top = max(high, key=values.__getitem__)
        excess = 100.0 * (values[top] - mid) / mid if mid > 0 else float("inf")
        out.append(Finding(
            rule="job-imbalance", severity="warning",
            title=f"{'Rank' if len(high) == 1 else 'Ranks'} {format_ranks(high)} "
                  f"{'holds' if len(high) == 1 else 'hold'} more {key} memory than the others "
                  f"(+{fmt_bytes(values[top] - mid)} on rank {top})",
            summary=(f"{key.capitalize()} memory ({source}) of rank {top} is {fmt_bytes(values[top])} "
                     f"against a median of {fmt_bytes(mid)} over {len(values)} ranks"
                     + (f" (+{fmt_pct(excess)})." if excess != float("inf") else ".")),
            evidence=[f"rank {r}: {key} {fmt_bytes(v)}" for r, v in sorted(values.items())][:64],
            where=[f"rank {top}: {s['site']} ({fmt_bytes(s['bytes'])})"
                   for s in per[top][0].data.get("sites", [])[:3]],
            fix=["Find what only those ranks keep: rank-0-only state (metrics, EMA weights, "
                 "checkpoint buffers, evaluation tensors), uneven batch or sequence sizes, "
                 "optimizer state not sharded evenly (ZeRO/FSDP bucket sizes).",
                 "Compare `torch tensors` censuses of a normal and a heavy rank: "
                 "`flight_profiler PID --ranks 0,3 --cmd \"torch tensors\"`."],
            root_cause="Every rank must fit the heaviest: the job's batch size and model are "
                       "limited by the rank that holds the most.",
            inputs=[per[r][0].path for r in high], ranks=high,
            metrics={"key": key, "source": source, "median_bytes": mid,
                     "per_rank": {str(r): v for r, v in values.items()}},
        ))
    return out


def check(ctx: Context) -> list[Finding]:
    return _memory(ctx.snapshots, ctx.traces) + [f for f in judge(ctx) if f.rule == "job-imbalance"]


RULE = Rule("job-imbalance", "Memory or step time differs across ranks", check)
