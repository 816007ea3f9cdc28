"""launch-overhead: many short kernels (GPU) or many tiny operators (CPU): dispatch dominates.

GPU: >= 200 kernels, >= 50 % of them shorter than 10 us, and the GPU idle >= 15 % of the time
or the CPU spending longer in cudaLaunchKernel than the GPU in kernels (launch-bound).
CPU-only: >= 500 operator calls, >= 50 % of them under 10 us of self time, together >= 10 % of
the step time, or >= 40 % of all operator self time and >= 5 % of the step time. Its severity
follows what the fix recovers: operators the program's own loop issues one by one from Python,
each under 10 us in all (a loop over slices: vectorising it removes them), from 10 % of the step
time; tiny operators that run inside library operators (an LSTM cell's gates, a linear layer's
transpose) and inside autograd's backward are the eager-mode cost of the model's structure,
which no rewrite of the program's loop removes: info, with torch.compile as the option
(docs/report-rules.md, "launch-overhead on CPU"). Figures without that split (an older report's
metrics): a warning only from 20 % of the step time or 60 % of operator self time, or with
>= 500 operator calls per step >= 80 % of them tiny (below: info, borderline).
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.cost import cost_of, severity_for, window_of
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.stacks import SMALL_FACTOR
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us

FIX = [
    "Fuse small element-wise ops: `torch.compile(model)` (or a fused kernel/op such as "
    "fused optimizers `foreach=True`/`fused=True`).",
    "Batch work: one op on a stacked tensor instead of a Python loop of ops on slices.",
    "Capture the static part of the step in CUDA graphs (`torch.compile(mode='reduce-overhead')` "
    "or torch.cuda.graphs).",
]
IDLE_PCT = 15.0
# CPU-only: a warning needs tiny operators to take at least this share of the window; between
# the detection thresholds and this one the finding is info ("borderline"). Measured here on a
# 2-core machine with 3 busy processes: a small healthy MLP loop swung from 2 % to 13 % of the
# window between runs (37 % of operator self time at most; preemption inflates some operators'
# mean self time past the 10 us line), while a Python loop of tiny ops measured 26-34 % of the
# window unloaded and 72 % of operator self time in the fixture. One borderline run is no verdict.
CPU_WARNING_WINDOW_PCT = 20.0
# ... or tiny operators are most of all operator self time (steady when the window is inflated),
# ... or, whatever the times, the step issues many operators, nearly all tiny: counts do not move
# with the load. The tiny-ops sample issues ~1140 per step (92 % tiny; 16 % of the window and
# 34 % of operator time under diagnose on a loaded machine); small healthy loops 60-110.
CPU_WARNING_OPS_PCT = 60.0
# Operators the program's own lines issue one by one per step, each under 10 us: the tiny-ops
# sample issues ~260 (64 time steps x 4 ops on a 32-element column), healthy loops fewer than
# 20, an LSTMCell loop none (its operators come from inside nn.LSTMCell).
PYTHON_TINY_PER_STEP = 200
# ... when they are at least this share of all operator self time (the tiny-ops sample: most of
# it; an actor-critic's per-environment-step operators: 2 %).
PYTHON_TINY_OPS_SHARE_PCT = 10.0
CPU_WARNING_OPS_PER_STEP = 500
CPU_WARNING_TINY_CALLS_PCT = 80.0


def _callers(rows: list[dict[str, Any]], what: str) -> list[str]:
    """The Python lines issuing them (from a uniform sample of the occurrences)."""
    return [f"{r['where']} via {r['operator']}: {r['count']} {what} in the sample"
            for r in rows[:3] if not r["where"].startswith("(")]


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        d = tr.data
        k = d.get("kernels")
        if d.get("has_gpu") and k:
            idle = d["gpu_time_breakdown"]["idle_pct"]
            launch_bound = k["launch_total_us"] >= T.launch_to_kernel_ratio * k["total_us"] > 0
            if (k["count"] >= T.min_kernels and k["short_pct"] >= T.short_kernel_share_pct
                    and (idle >= IDLE_PCT or launch_bound)):
                b = d["gpu_time_breakdown"]
                cost = cost_of(b.get("short_gap_us", 0.0), b["span_us"], "GPU time",
                               f"GPU idle in gaps under {T.launch_gap_us:.0f} us between GPU work "
                               "(launch latency that CUDA graphs / fusion remove)")
                out.append(Finding(
                    rule="launch-overhead", severity=severity_for(cost), cost=cost,
                    title=f"{fmt_pct(k['short_pct'])} of {k['count']} kernels run under {T.short_kernel_us:.0f} us",
                    summary=(f"{label(tr)}: median kernel {fmt_us(k['median_us'])}, "
                             f"{k['per_step'] or k['count']} kernels per step, {k['launch_calls']} "
                             f"cudaLaunchKernel calls averaging {fmt_us(k['launch_mean_us'])}; the GPU is "
                             f"idle {fmt_pct(idle)} of the time."),
                    evidence=[f"kernels: {k['count']}, short (<{T.short_kernel_us:.0f} us): {k['short_count']}",
                              f"launch time on CPU {fmt_us(k['launch_total_us'])} vs kernel time "
                              f"{fmt_us(k['total_us'])}", f"GPU idle {fmt_pct(idle)}"],
                    where=_callers(k.get("short_callers", []), "short kernels")
                    + [f"kernel {x['name'][:90]}: {x['calls']} calls, mean {fmt_us(x['mean_us'])}"
                       for x in sorted(d.get("top_kernels", []), key=lambda x: -x["calls"])[:3]],
                    fix=FIX, inputs=[tr.path],
                    root_cause="Kernels are so short that launching them costs as much as running them.",
                    metrics={"kernels": k["count"], "short_pct": k["short_pct"],
                             "median_us": k["median_us"], "idle_pct": idle, "launch_bound": launch_bound},
                ))
            continue
        ops = d.get("operators")
        if d.get("has_gpu") or not ops:
            continue
        found = _cpu(tr, ops)
        if found is not None:
            out.append(found)
    return out


RULE = Rule("launch-overhead", "Many tiny kernels or operators", check)


def _detected(ops: dict[str, Any]) -> bool:
    return bool(ops["calls"] >= T.min_ops and ops["tiny_calls_pct"] >= T.tiny_op_share_pct
            and (ops["tiny_self_pct_of_window"] >= T.tiny_op_window_pct
                 or (ops.get("tiny_self_pct_of_ops", 0.0) >= T.tiny_op_self_share_pct
                     and ops["tiny_self_pct_of_window"] >= T.tiny_op_window_floor_pct)))


def _cpu(tr: InputResult, ops: dict[str, Any]) -> Finding | None:
    """CPU-only: many tiny operators. A warning only for the ones the program's own loop issues
    one by one from Python (what rewriting that loop removes); tiny operators inside library
    operators and autograd's backward are the eager-mode cost of the model's structure (info)."""
    d = tr.data
    steps = float(d.get("steps", {}).get("count") or 0)
    issued = ops.get("from_python_small_calls", ops.get("from_python_tiny_calls"))
    per_step = float(issued or 0) / steps if steps else 0.0
    # Counts do not move with the machine's load; time shares do (a loaded machine slows the
    # operators past the 10 us line and the step with them: the count is of those under twice
    # the line, stacks.SMALL_FACTOR, which a slower machine does not move, 1074 -> 1599 of
    # 1715 under 10 us, 1604 -> 1644 under 20 us). But a count alone is no cost: an
    # actor-critic loop issues ~370 tiny operators a step from Python (one environment step at
    # a time) that take 1 % of its step and 2 % of its operators' time, the rest being its
    # layers' and backward's own: a warning there is a false alarm. So the count counts when
    # those operators are also a real part of the work: of the window (the floor of any
    # finding), or of all operator time, which load inflates alike.
    window_share = float(ops.get("from_python_tiny_pct_of_window", 100.0) or 0.0)
    tiny_of_ops = float(ops.get("tiny_self_pct_of_ops") or 0.0)
    all_ops_us = float(ops.get("tiny_self_us") or 0.0) * 100.0 / tiny_of_ops if tiny_of_ops else 0.0
    ops_share = (100.0 * float(ops.get("from_python_tiny_us") or 0.0) / all_ops_us
                 if all_ops_us else 100.0)
    many = per_step >= PYTHON_TINY_PER_STEP and (
        window_share >= T.tiny_op_window_floor_pct or ops_share >= PYTHON_TINY_OPS_SHARE_PCT)
    if not _detected(ops) and not many:
        return None
    top = sorted(d.get("top_operators", []), key=lambda x: -x["calls"])[:3]
    window, of = window_of(d)
    where = (_callers(ops.get("tiny_callers", []), "tiny ops")
             + [f"{x['name']}: {x['calls']} calls, mean self {fmt_us(x['mean_self_us'])}" for x in top])
    summary = (f"{label(tr)}: {ops['tiny_calls']} operator calls under {T.tiny_op_us:.0f} us of "
               f"self time take {fmt_pct(ops['tiny_self_pct_of_window'])} of the "
               f"{d['window_kind']} time and {fmt_pct(ops.get('tiny_self_pct_of_ops', 0.0))} "
               "of all operator self time"
               + (f" ({ops['per_step']} calls per step)" if ops.get("per_step") else "") + ".")
    evidence = [f"operator calls {ops['calls']}, distinct {ops['distinct']}",
                f"tiny calls {ops['tiny_calls']} ({fmt_pct(ops['tiny_calls_pct'])}), self time "
                f"{fmt_us(ops['tiny_self_us'])}"]
    metrics = {"calls": ops["calls"], "tiny_calls_pct": ops["tiny_calls_pct"],
               "tiny_self_pct_of_window": ops["tiny_self_pct_of_window"],
               "tiny_self_pct_of_ops": ops.get("tiny_self_pct_of_ops", 0.0)}
    if "from_python_tiny_pct_of_window" not in ops:
        return _cpu_by_shares(tr, ops, window, of, summary, evidence, where, metrics)
    python_pct = float(ops["from_python_tiny_pct_of_window"])
    evidence.append(f"issued one by one from Python, each under {T.tiny_op_us:.0f} us in all: "
                    f"{ops['from_python_tiny_calls']} calls, {fmt_pct(python_pct)} of the "
                    f"{d['window_kind']} time")
    metrics["from_python_tiny_pct_of_window"] = python_pct
    if python_pct >= T.tiny_op_window_pct or many:
        cost = cost_of(float(ops["from_python_tiny_us"]), window, of,
                       f"time of operators issued one by one from Python, each under "
                       f"{T.tiny_op_us:.0f} us (an upper bound of what vectorising the loop recovers)")
        severity = severity_for(cost)
        if many and severity == "info":
            severity = "warning"
            evidence.append(f"{per_step:.0f} calls per step issued one by one from Python, each "
                            f"under {T.tiny_op_us * SMALL_FACTOR:.0f} us: a loop of the program's own "
                            f"(from {PYTHON_TINY_PER_STEP} a step a warning whatever the time "
                            "share, which a loaded machine moves)")
        return Finding(
            rule="launch-overhead", severity=severity, cost=cost,
            title=(f"{ops['from_python_tiny_calls']} tiny operators issued one by one from Python "
                   f"({fmt_pct(python_pct)} of the {d['window_kind']} time)"),
            summary=summary, evidence=evidence, where=where, fix=FIX[:2], inputs=[tr.path],
            root_cause=("A Python loop issues operators that each do almost nothing: dispatch "
                        "overhead dominates."),
            metrics=metrics)
    cost = cost_of(ops["tiny_self_us"], window, of,
                   f"self time of operators under {T.tiny_op_us:.0f} us inside library operators "
                   "and autograd (an upper bound of what fusing them recovers)")
    return Finding(
        rule="launch-overhead", severity="info", cost=cost,
        title=(f"{ops['calls']} operator calls, {fmt_pct(ops['tiny_calls_pct'])} of them tiny, "
               "inside library operators (eager-mode overhead)"),
        summary=summary + (" They run inside the model's own operators (an LSTM cell, a linear "
                           "layer) and their backward, not in a loop of the program's that "
                           "could be vectorised: the eager-mode cost of this model's structure."),
        evidence=evidence, where=where,
        fix=["Nothing in the program's own loop issues them one by one. To cut eager-mode "
             "overhead, compile the model: `model = torch.compile(model)` fuses the small "
             "operators of each layer and of its backward; measure the step before and after."],
        inputs=[tr.path],
        root_cause="Per-operator dispatch inside small library operators (eager execution).",
        metrics=metrics)


def _cpu_by_shares(tr: InputResult, ops: dict[str, Any], window: float, of: str, summary: str,
                   evidence: list[str], where: list[str], metrics: dict[str, Any]) -> Finding:
    """Figures without the Python-issued split (older reports' metrics): by time shares."""
    per_step = ops.get("per_step") or 0
    # Counts do not change with the machine's load; time shares do.
    many = per_step >= CPU_WARNING_OPS_PER_STEP and ops["tiny_calls_pct"] >= CPU_WARNING_TINY_CALLS_PCT
    clear = (ops["tiny_self_pct_of_window"] >= CPU_WARNING_WINDOW_PCT
             or ops.get("tiny_self_pct_of_ops", 0.0) >= CPU_WARNING_OPS_PCT or many)
    cost = cost_of(ops["tiny_self_us"], window, of,
                   f"self time of operators under {T.tiny_op_us:.0f} us (dispatch-bound; "
                   "an upper bound of what fusing them recovers)")
    if not clear:
        evidence = [*evidence,
                    f"tiny operators take {fmt_pct(ops['tiny_self_pct_of_window'])} of the window and "
                    f"{fmt_pct(ops.get('tiny_self_pct_of_ops', 0.0))} of operator time, under the "
                    f"{CPU_WARNING_WINDOW_PCT:.0f} % / {CPU_WARNING_OPS_PCT:.0f} % of a warning: on a "
                    "busy machine these shares swing from run to run; profile again before acting"]
    return Finding(
        rule="launch-overhead", severity=severity_for(cost) if clear else "info", cost=cost,
        title=(f"{ops['calls']} operator calls, {fmt_pct(ops['tiny_calls_pct'])} of them tiny"
               + ("" if clear else " (borderline)")),
        summary=summary, evidence=evidence, where=where, fix=FIX[:2], inputs=[tr.path],
        root_cause="Per-operator dispatch overhead dominates: each op does very little work.",
        metrics=metrics)
