"""sync-bottleneck: the CPU blocks waiting for the GPU (synchronize calls, .item(), .cpu()).

Blocking time = cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize calls, or
the scalar reads (aten::item -> aten::_local_scalar_dense) that contain them, whichever is larger,
as a share of step time (of the trace window without steps). The GPU idle gaps right after each
sync are reported: while the CPU waited, nothing new was queued.
"""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        s = tr.data.get("sync")
        if not s:
            continue
        pct = s["pct_of_window"]
        if pct < T.sync_warning_pct:
            continue
        sev = "critical" if pct >= T.sync_critical_pct else "warning"
        blocked = max(s["sync_us"], s["scalar_read_us"])
        gpu = tr.data.get("has_gpu")
        out.append(Finding(
            rule="sync-bottleneck", severity=sev,
            title=f"The CPU waits for the GPU {fmt_pct(pct)} of the {tr.data['window_kind']} time",
            summary=(f"{label(tr)}: {s['sync_calls']} synchronize calls ({fmt_us(s['sync_us'])}) and "
                     f"{s['scalar_reads']} scalar reads (.item()/.cpu(), {fmt_us(s['scalar_read_us'])}) "
                     f"block the CPU for {fmt_us(blocked)} of {fmt_us(tr.data['window_us'])}"
                     + (f"; the GPU then sits idle {fmt_us(s['gpu_idle_after_sync_us'])}." if gpu else ".")),
            evidence=[f"{name}: {v['count']} calls, {fmt_us(v['total_us'])}" for name, v in s["by_call"].items()]
            + [f"aten::item / _local_scalar_dense: {s['scalar_reads']} calls, {fmt_us(s['scalar_read_us'])}",
               f"GPU idle right after syncs: {fmt_us(s['gpu_idle_after_sync_us'])}"],
            where=[f"{c['where']} via {c['operator']}: {c['count']} calls, {fmt_us(c['total_us'])}"
                   for c in s["callers"][:6]],
            fix=["Do not read GPU values every step: keep running sums on the GPU "
                 "(`total += loss.detach()`) and call `.item()` every N steps or at the end.",
                 "Replace `if tensor_condition:` / `print(tensor)` / `.tolist()` in the loop with "
                 "GPU-side ops (torch.where, masks).",
                 "Use `t.to('cpu', non_blocking=True)` with pinned memory and an event when the value "
                 "is needed later.",
                 "Find every hidden sync with `torch.cuda.set_sync_debug_mode('warn')`."],
            inputs=[tr.path],
            root_cause=("Each .item()/.cpu()/synchronize drains the GPU queue; the CPU stops "
                        "launching work until the GPU finishes, then the GPU waits for the CPU."),
            metrics={"pct_of_window": pct, "blocked_us": blocked, "sync_calls": s["sync_calls"],
                     "scalar_reads": s["scalar_reads"],
                     "gpu_idle_after_sync_us": s["gpu_idle_after_sync_us"]},
        ))
    return out


RULE = Rule("sync-bottleneck", "CPU-GPU synchronisation stalls", check)
