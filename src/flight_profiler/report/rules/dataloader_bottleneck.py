"""dataloader-bottleneck: the step waits for the DataLoader's next batch.

Share = time in ``enumerate(DataLoader)#...__next__`` annotations inside ProfilerSteps / total
step time (trace window without steps). torch-tb-profiler recommended more workers above 5 %.
"""

from __future__ import annotations

from flight_profiler.report.cost import cost_of, severity_for, window_of
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        dl = tr.data.get("dataloader")
        if not dl:
            continue
        pct = dl["pct_of_window"]
        if pct < T.dataloader_warning_pct:
            continue
        window, of = window_of(tr.data)
        idle = dl.get("gpu_idle_during_us")
        if idle is None:  # CPU-only: the step does nothing else while it waits
            cost = cost_of(dl["total_us"], window, of, "time waiting in DataLoader.__next__")
        else:
            cost = cost_of(idle, window, of,
                           "GPU idle while the step waits in DataLoader.__next__ (a wait the GPU "
                           "does not notice costs nothing)")
        out.append(Finding(
            rule="dataloader-bottleneck", severity=severity_for(cost), cost=cost,
            title=f"Waiting for the DataLoader takes {fmt_pct(pct)} of the step",
            summary=(f"{label(tr)}: {dl['calls']} next() calls, {fmt_us(dl['total_us'])} in total, "
                     f"{fmt_us(dl['mean_us'])} each, {fmt_pct(pct)} of the {tr.data['window_kind']} time."),
            evidence=[f"DataLoader __next__: {dl['calls']} calls, {fmt_us(dl['total_us'])}",
                      f"{tr.data['window_kind']} time {fmt_us(tr.data['window_us'])}"],
            where=[f"{c['where']}: {c['count']} next() calls, {fmt_us(c['total_us'])}"
                   for c in dl.get("callers", [])[:3] if not c["where"].startswith("(")]
            + ["enumerate(DataLoader).__next__ (the training loop's `for batch in loader`)"],
            fix=["Load in parallel: `DataLoader(..., num_workers=N)` (start with the number of CPU "
                 "cores / GPUs), `persistent_workers=True`, `prefetch_factor=2..4`.",
                 "`pin_memory=True` for GPU training, with `.to(device, non_blocking=True)`.",
                 "Move expensive per-sample work (decoding, augmentation) out of __getitem__: "
                 "pre-process once, cache, or do it batched on the GPU."],
            inputs=[tr.path],
            root_cause="Batches are produced more slowly than the model consumes them.",
            metrics={"pct_of_window": pct, "total_us": dl["total_us"], "calls": dl["calls"]},
        ))
    return out


RULE = Rule("dataloader-bottleneck", "The step waits for input data", check)
