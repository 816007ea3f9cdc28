"""job-straggler: one rank computes longer than the others, which wait for it in collectives.

From per-rank traces of the same steps (``distributedInfo.rank``, or ``rank<N>`` in the file
name): compute = what the rank runs outside collectives (GPU compute kernels, else CPU
operators), collective = time inside collectives (NCCL kernels, ``c10d::`` / ``gloo:`` spans),
both as shares of the rank's own trace window so windows of different lengths compare. A rank
whose compute share is >= ``straggler_ratio`` x the median of the others, while the others
spend at least as much of their window in collectives as it does, is the straggler: every synchronous
collective makes the whole job run at its pace.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.rank_list import format_ranks
from flight_profiler.report.job_metrics import is_comm
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.rules.job_common import JT, by_rank, median
from flight_profiler.report.units import fmt_pct, fmt_us


def rank_figures(traces: list[InputResult]) -> dict[int, dict[str, Any]]:
    """Per rank: compute / collective shares of the window, step times, heaviest operators."""
    out: dict[int, dict[str, Any]] = {}
    for rank, inputs in by_rank(traces).items():
        compute = coll = span = 0.0
        steps: list[float] = []
        ops: dict[str, float] = {}
        for inp in inputs:
            d = inp.data.get("distributed")
            if not isinstance(d, dict) or not d.get("span_us"):
                continue
            compute += float(d["compute_us"])
            coll += float(d["collective_us"])
            span += float(d["span_us"])
            steps.extend(float(x) for x in (inp.data.get("steps") or {}).get("durations_us", []))
            for op in inp.data.get("top_operators", []):
                if not is_comm(str(op.get("name", ""))):
                    ops[op["name"]] = ops.get(op["name"], 0.0) + float(op.get("self_us", 0.0))
        if span <= 0:
            continue
        out[rank] = {
            "compute_pct": 100.0 * compute / span, "collective_pct": 100.0 * coll / span,
            "compute_us": compute, "collective_us": coll, "span_us": span,
            "step_mean_us": sum(steps) / len(steps) if steps else None, "steps": steps,
            "top_ops": sorted(ops.items(), key=lambda kv: -kv[1])[:3],
            "inputs": [i.path for i in inputs],
        }
    return out


def _stack_sites(ctx: Context, ranks: list[int]) -> list[str]:
    """Where the slow ranks were seen outside collectives in their stack samples, if taken."""
    from collections import Counter

    from flight_profiler.report.rank_stacks import rank_position

    per = by_rank(ctx.stacks)
    out: list[str] = []
    for r in ranks:
        seen: Counter[str] = Counter()
        total = 0
        for inp in per.get(r, []):
            for sample in inp.data.get("samples", []):
                total += 1
                p = rank_position(sample)
                if p.kind != "collective":
                    seen[f"{p.function} at {p.where}"] += 1
        out.extend(f"rank {r}: {site} ({n} of {total} stack samples)" for site, n in seen.most_common(2))
    return out


def check(ctx: Context) -> list[Finding]:
    figs = rank_figures(ctx.traces)
    if len(figs) < 2:
        return []
    slow: list[int] = []
    for rank, f in figs.items():
        others = [g["compute_pct"] for r, g in figs.items() if r != rank]
        base = median(others)
        waits_more = median([g["collective_pct"] for r, g in figs.items() if r != rank])
        # On gloo a collective's span includes the transfer, so the slow rank's own share in
        # collectives can match the others' under load: a compute share this far above the
        # others' stands on its own.
        clear = base > 0 and f["compute_pct"] >= JT.straggler_clear_ratio * base
        if (f["compute_pct"] >= JT.straggler_ratio * base
                and f["compute_pct"] - base >= JT.straggler_min_share_pct
                and (clear or waits_more >= f["collective_pct"] - JT.straggler_wait_tolerance_pct)):
            slow.append(rank)
    # With many ranks, several may qualify; more than half "slow" means no outlier at all.
    if not slow or len(slow) * 2 > len(figs):
        return []
    fast = [r for r in figs if r not in slow]
    base_compute = median([figs[r]["compute_pct"] for r in fast])
    base_wait = median([figs[r]["collective_pct"] for r in fast])
    worst = max(slow, key=lambda r: figs[r]["compute_pct"])
    w = figs[worst]
    ratio = w["compute_pct"] / base_compute if base_compute > 0 else float("inf")
    evidence = [f"rank {r}: compute {fmt_pct(g['compute_pct'])} of its window "
                f"({fmt_us(g['compute_us'])}), in collectives {fmt_pct(g['collective_pct'])}"
                + (f", step {fmt_us(g['step_mean_us'])}" if g["step_mean_us"] else "")
                for r, g in sorted(figs.items())][:64]
    means = [g["step_mean_us"] for g in figs.values() if g["step_mean_us"]]
    if len(means) >= 2:
        evidence.append(f"step-time skew across ranks: {fmt_us(max(means) - min(means))} "
                        f"(max {fmt_us(max(means))}, min {fmt_us(min(means))})")
    where = _stack_sites(ctx, slow) + [f"rank {r}: {name} ({fmt_us(us)} self time)"
                                       for r in slow for name, us in figs[r]["top_ops"]]
    return [Finding(
        rule="job-straggler", severity="warning",
        title=(f"Rank {slow[0]} is a straggler" if len(slow) == 1
               else f"Ranks {format_ranks(slow)} are stragglers")
              + f": {ratio:.1f}x the compute of the others, who wait in collectives",
        summary=(f"Rank {worst} computes {fmt_pct(w['compute_pct'])} of its window against a median "
                 f"of {fmt_pct(base_compute)} on the other ranks, which spend "
                 f"{fmt_pct(base_wait)} in collectives (rank {worst}: "
                 f"{fmt_pct(w['collective_pct'])}). Every synchronous collective runs the job at "
                 "the slowest rank's pace."),
        evidence=evidence, where=where,
        fix=["Make the slow rank's extra work go away: its heaviest operators are listed under "
             "`where` (uneven batch sizes or sequence lengths per rank, rank-0-only logging, "
             "evaluation or checkpointing inside the step, a slower device or a busy host).",
             "Balance the data: equal-size shards (DistributedSampler), bucketing by length.",
             "If the host is shared, pin each rank to its own cores (OMP_NUM_THREADS, taskset)."],
        root_cause="The other ranks finish their compute first and wait in the collective for "
                   "the slow one.",
        inputs=[p for r in slow for p in figs[r]["inputs"]], ranks=slow,
        metrics={"ranks": {str(r): {k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in g.items() if k not in ("steps", "inputs", "top_ops")}
                           for r, g in sorted(figs.items())},
                 "compute_ratio": round(ratio, 3) if ratio != float("inf") else None},
    )]


RULE = Rule("job-straggler", "One rank is slower than the others, who wait for it", check)
