"""low-gpu-utilization: the GPU is busy only a small share of the profiled window.

Busy = union of kernels, copies, memsets and syncs over the span from the first to the last GPU
event (HTA's definition). torch-tb-profiler recommended a larger batch when busy < 50 %.
"""

from __future__ import annotations

from flight_profiler.report.cost import cost_of, severity_for
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        b = tr.data.get("gpu_time_breakdown")
        if not b or b["span_us"] < T.min_gpu_window_us:
            continue
        busy = b["busy_pct"]
        if busy >= T.gpu_busy_warning_pct:
            continue
        cost = cost_of(b["idle_us"], b["span_us"], "GPU time",
                       "GPU idle time in its active span (an upper bound: the other findings "
                       "say which cause explains which part)")
        out.append(Finding(
            rule="low-gpu-utilization", severity=severity_for(cost), cost=cost,
            title=f"The GPU is busy only {fmt_pct(busy)} of the time",
            summary=(f"{label(tr)}: over {fmt_us(b['span_us'])} the GPU computed {fmt_pct(b['compute_pct'])}, "
                     f"copied/communicated {fmt_pct(b['non_compute_pct'])} and sat idle {fmt_pct(b['idle_pct'])}."),
            evidence=[f"idle {fmt_us(b['idle_us'])} ({fmt_pct(b['idle_pct'])}), compute "
                      f"{fmt_us(b['compute_us'])} ({fmt_pct(b['compute_pct'])}), non-compute "
                      f"{fmt_us(b['non_compute_us'])} ({fmt_pct(b['non_compute_pct'])})",
                      f"{len(tr.data.get('gpu_idle_gaps', []))} longest idle gaps listed under Where, "
                      "with what the CPU thread that ended each one was doing"],
            where=[f"idle {fmt_us(g['idle_us'])} at +{fmt_us(g['at_us'])} while the CPU was in "
                   f"{g['cpu_was_in']}" + (f" > {g['innermost']}" if g["innermost"] not in
                                            (None, g["cpu_was_in"]) else "")
                   + (f" ({g['where']})" if not g["where"].startswith("(") else "")
                   for g in tr.data.get("gpu_idle_gaps", [])[:5]]
            or [f"GPU devices {tr.data.get('gpu_devices')}"],
            fix=["Fix the findings that stall the CPU first (sync, DataLoader, transfers): the GPU "
                 "waits for them.",
                 "Give the GPU more work per launch: a larger batch size, or torch.compile to fuse ops.",
                 "Overlap input copies and compute (pin_memory + non_blocking, prefetching)."],
            inputs=[tr.path],
            root_cause="The CPU side does not feed the GPU fast enough, or the work per step is too small.",
            metrics=dict(b),
        ))
    return out


RULE = Rule("low-gpu-utilization", "The GPU is mostly idle", check)
