"""sync-bottleneck: the CPU blocks waiting for the GPU (synchronize calls, .item(), .cpu()).

Blocking time = cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize calls, or
the scalar reads (aten::item -> aten::_local_scalar_dense) that contain them, whichever is larger,
as a share of step time (of the trace window without steps). The pattern is reported from
T.sync_warning_pct of blocking; what it costs is only the GPU idle it causes: from each wait's
return to the next GPU work, no more than the wait itself, each idle gap once. Waiting on a
saturated GPU is the healthy GPU-bound state: it costs nothing and is at most info.
"""

from __future__ import annotations

from flight_profiler.report.cost import cost_of, severity_for, window_of
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us

METHOD = ("GPU idle from each wait's return to the next GPU work, at most the wait itself, "
          "each idle gap counted once")


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        s = tr.data.get("sync")
        if not s or not tr.data.get("has_gpu"):
            continue
        pct = s["pct_of_window"]
        if pct < T.sync_warning_pct:
            continue
        blocked = max(s["sync_us"], s["scalar_read_us"])
        window, of = window_of(tr.data)
        lost = s.get("gpu_idle_caused_us", s["gpu_idle_after_sync_us"])
        cost = cost_of(lost, window, of, METHOD)
        sev = severity_for(cost)
        what = (f"{s['sync_calls']} synchronize calls ({fmt_us(s['sync_us'])}) and {s['scalar_reads']} "
                f"scalar reads (.item()/.cpu(), {fmt_us(s['scalar_read_us'])}) block the CPU for "
                f"{fmt_us(blocked)} of {fmt_us(window)}")
        if sev == "info":
            title = (f"The CPU waits for a busy GPU {fmt_pct(pct)} of the {of}: "
                     f"costs {fmt_pct(cost.pct)}")
            verdict = (f"; the GPU stays busy through the waits (idle after them: {fmt_us(lost)}), "
                       "so this is the GPU-bound state, not a bottleneck.")
        else:
            title = f"Waiting for the GPU leaves it idle {fmt_pct(cost.pct)} of the {of}"
            verdict = (f"; after the waits return the GPU sits idle {fmt_us(lost)} "
                       "until the CPU queues work again.")
        out.append(Finding(
            rule="sync-bottleneck", severity=sev, title=title,
            summary=f"{label(tr)}: {what}{verdict}",
            evidence=[f"{name}: {v['count']} calls, {fmt_us(v['total_us'])}" for name, v in s["by_call"].items()]
            + [f"aten::item / _local_scalar_dense: {s['scalar_reads']} calls, {fmt_us(s['scalar_read_us'])}",
               f"GPU idle caused (after each wait, at most the wait): {fmt_us(lost)}"],
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
            root_cause=("Each .item()/.cpu()/synchronize drains the GPU queue; when the CPU then has "
                        "host work before its next launch, the GPU waits for it."),
            metrics={"pct_of_window": pct, "blocked_us": blocked, "sync_calls": s["sync_calls"],
                     "scalar_reads": s["scalar_reads"],
                     "gpu_idle_after_sync_us": s["gpu_idle_after_sync_us"],
                     "gpu_idle_caused_us": lost},
            cost=cost,
        ))
    return out


RULE = Rule("sync-bottleneck", "CPU-GPU synchronisation stalls", check)
