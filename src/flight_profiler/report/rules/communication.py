"""communication: collective kernels (NCCL, gloo) that compute does not hide.

Per rank: communication kernels as a share of GPU kernel time, and the exposed part of their
time (the union of collective kernels minus its overlap with compute kernels) as a share of
the GPU span. Only the exposed part costs step time: a collective that runs under the backward
pass is free. Reported from T.comm_exposed_min_pct of the span; severity from that cost.
"""

from __future__ import annotations

from flight_profiler.report.cost import cost_of, severity_for
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us

METHOD = ("collective kernel time not overlapped by compute kernels (interval union), "
          "share of the GPU span")

FIX = [
    "Overlap communication with compute: DDP does it during backward when gradients are ready; "
    "keep `find_unused_parameters=False` and do not call `.item()`/sync between backward and step.",
    "Tune the bucket size: `DDP(model, bucket_cap_mb=N)` (default 25); larger buckets mean "
    "fewer, larger all-reduces; smaller ones start overlapping earlier.",
    "Fewer, larger collectives: coalesce small tensors (`torch.distributed` bucketing, "
    "`all_reduce_coalesced`) instead of one collective per parameter or per metric.",
    "With gradient accumulation, skip the all-reduce of all but the last micro-batch: "
    "`with model.no_sync(): loss.backward()`.",
    "FSDP: enable `forward_prefetch=True` and `backward_prefetch=BackwardPrefetch.BACKWARD_PRE`.",
    "If exposed time stays high with large buckets, check the interconnect "
    "(`NCCL_DEBUG=INFO` shows whether NCCL uses NVLink/InfiniBand or falls back to sockets).",
]


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        c = tr.data.get("communication")
        b = tr.data.get("gpu_time_breakdown")
        if not c or not b or b["span_us"] < T.min_gpu_window_us:
            continue
        if c["exposed_pct_of_span"] < T.comm_exposed_min_pct:
            continue
        cost = cost_of(c["exposed_us"], b["span_us"], "GPU time", METHOD)
        out.append(Finding(
            rule="communication", severity=severity_for(cost),
            title=(f"Communication not hidden by compute takes {fmt_pct(cost.pct)} of GPU time"),
            summary=(f"{label(tr)}: {c['kernels']} collective kernels are "
                     f"{fmt_pct(c['pct_of_kernel_time'])} of GPU kernel time; "
                     f"{fmt_pct(c['overlapped_pct'])} of their {fmt_us(c['comm_us'])} overlaps compute, "
                     f"{fmt_us(c['exposed_us'])} is exposed."),
            evidence=[f"communication {fmt_us(c['comm_us'])}, exposed {fmt_us(c['exposed_us'])} "
                      f"({fmt_pct(c['exposed_pct_of_span'])} of the GPU span {fmt_us(b['span_us'])})"]
            + [f"{x['name']}: {x['calls']} calls, {fmt_us(x['total_us'])}, mean {fmt_us(x['mean_us'])}"
               for x in c["by_name"][:3]],
            where=[f"{x['name']}: {x['calls']} calls, mean {fmt_us(x['mean_us'])}"
                   for x in c["by_name"][:3]],
            fix=FIX, inputs=[tr.path],
            root_cause=("Collectives that run while no compute kernel runs add their whole duration "
                        "to the step: too small buckets, a sync that serialises them, or a slow link."),
            metrics=dict(c, span_us=b["span_us"]),
            cost=cost,
        ))
    return out


RULE = Rule("communication", "Exposed collective communication", check)
