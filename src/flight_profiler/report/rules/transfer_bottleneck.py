"""transfer-bottleneck: host<->device copies take a large share of GPU time, or are pageable.

Share = HtoD + DtoH (+ HtoH) memcpy time / GPU busy time. Pageable copies are staged through a
bounce buffer and cannot overlap compute; pinned memory + non_blocking=True fixes both.
"""

from __future__ import annotations

from flight_profiler.report.cost import cost_of, severity_for
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes, fmt_pct, fmt_us


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        mc = tr.data.get("memcpy")
        if not mc or not tr.data.get("has_gpu"):
            continue
        share = mc["host_device_pct_of_gpu_busy"]
        pageable = mc["pageable_bytes"]
        if share < T.transfer_warning_pct and pageable < T.pageable_min_bytes:
            continue
        # Only the copy time no compute kernel overlaps delays the GPU's work.
        span = tr.data["gpu_time_breakdown"]["span_us"]
        cost = cost_of(mc.get("host_device_exposed_us", mc["host_device_us"]), span, "GPU time",
                       "host<->device copy time not overlapped by compute kernels, share of the GPU span")
        sev = severity_for(cost)
        fix = []
        if pageable:
            fix.append("Copy from pinned memory: `DataLoader(..., pin_memory=True)` or "
                       "`t.pin_memory()`, then `t.to('cuda', non_blocking=True)` so the copy "
                       "overlaps compute.")
        fix += ["Move data to the GPU once (whole dataset or model state) instead of every step.",
                "Avoid `.cpu()` / `.numpy()` / `.tolist()` on GPU tensors inside the loop; reduce on the "
                "GPU and copy one scalar.",
                "Prefetch the next batch on a side CUDA stream while the current one computes."]
        out.append(Finding(
            rule="transfer-bottleneck", severity=sev, cost=cost,
            title=f"Host<->device copies take {fmt_pct(share)} of GPU busy time",
            summary=(f"{label(tr)}: {fmt_us(mc['host_device_us'])} of memcpy between host and device "
                     f"({fmt_pct(share)} of GPU busy time); {fmt_bytes(pageable)} copied from pageable memory."),
            evidence=[f"{k['kind']}: {k['count']} copies, {fmt_bytes(k['bytes'])}, {fmt_us(k['total_us'])} "
                      f"({fmt_pct(k['pct_of_gpu_busy'])} of GPU busy)" for k in mc["by_kind"]],
            where=[f"{c['where']} via {c['operator']}: {c['count']} copies, {fmt_us(c['total_us'])}"
                   for c in mc.get("callers", [])[:5]] or ["(no Python stacks: profile with with_stack=True)"],
            fix=fix, inputs=[tr.path],
            root_cause=("Data moves between host and device inside the step, synchronously "
                        "(pageable memory), so the GPU waits for it."),
            metrics={"pct_of_gpu_busy": share, "host_device_us": mc["host_device_us"],
                     "pageable_bytes": pageable},
        ))
    return out


RULE = Rule("transfer-bottleneck", "Host-device copies slow the step", check)
