"""dataloader-bottleneck: the step waits for the DataLoader's next batch.

Share = time in ``enumerate(DataLoader)#...__next__`` annotations inside whole steps / the whole
steps' time (report/steps.py; the trace window without steps). Only the part of a wait inside
whole steps counts: a wait cut by the end of the profile window (the profiler stopped while the
loop waited) is clipped, or, without steps, left out, and the finding says so. torch-tb-profiler
recommended more workers above 5 %. The margin around that line widens to the per-step spread
of the share (report/cost.py judge).

From live evidence (diagnose, report/live_loop.py): the DataLoader's next() calls timed without
the profiler, over whole batch periods; the fix starts from the loader's real settings
(``settings_fix``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from flight_profiler.report.cost import Cost, cost_of, judge, window_of
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
        if pct < T.dataloader_min_pct:
            continue
        window, of = window_of(tr.data)
        idle = dl.get("gpu_idle_during_us")
        spread = _spread(dl.get("per_step_pct") or [])
        if idle is None:  # CPU-only: the step does nothing else while it waits
            cost = cost_of(dl["total_us"], window, of, "time waiting in DataLoader.__next__",
                           spread_pct=spread)
        else:
            cost = cost_of(idle, window, of,
                           "GPU idle while the step waits in DataLoader.__next__ (a wait the GPU "
                           "does not notice costs nothing)", spread_pct=spread)
        severity, borderline = verdict(cost)
        finding = Finding(
            rule="dataloader-bottleneck", severity=severity, cost=cost,
            title=f"Waiting for the DataLoader takes {fmt_pct(pct)} of the step",
            summary=(f"{label(tr)}: {dl['calls']} next() calls, {fmt_us(dl['total_us'])} in total, "
                     f"{fmt_us(dl['mean_us'])} each, {fmt_pct(pct)} of the {tr.data['window_kind']} time."),
            evidence=[f"DataLoader __next__: {dl['calls']} calls, {fmt_us(dl['total_us'])}",
                      f"{tr.data['window_kind']} time {fmt_us(tr.data['window_us'])}",
                      *_edges(dl), *_per_step(dl)],
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
        )
        if borderline:
            finding.mark_borderline(borderline)
        out.append(finding)
    return out


RULE = Rule("dataloader-bottleneck", "The step waits for input data", check)


def verdict(cost: Cost) -> tuple[str, str]:
    """Severity on this rule's own lines (a warning from T.dataloader_warning_pct), with the
    stated margin; the borderline note goes into the evidence too."""
    return judge(cost, warning_pct=T.dataloader_warning_pct)


def _spread(per_step: list[float]) -> float:
    """Two standard errors of the per-step shares (the margin the verdict is given with)."""
    if len(per_step) < 3:
        return 0.0
    return 2.0 * statistics.stdev(per_step) / math.sqrt(len(per_step))


def _edges(dl: dict[str, Any]) -> list[str]:
    clipped, left = int(dl.get("clipped") or 0), int(dl.get("left_out") or 0)
    if not clipped and not left:
        return []
    return [f"window edges: {clipped} wait(s) clipped to whole steps and {left} left out "
            f"({fmt_us(float(dl.get('cut_us') or 0.0))} not counted): a wait cut by the start or "
            "the end of the profile is no measurement of the loop"]


def _per_step(dl: dict[str, Any]) -> list[str]:
    shares = dl.get("per_step_pct") or []
    if len(shares) < 2:
        return []
    return ["per step: " + ", ".join(f"{v:.1f}%" for v in shares[:12])]


# -- the fix from the loader's real settings (diagnose's live evidence, report/live_loop.py) ----
_BUSY_WORKER_CPU = 70.0  # a worker above this CPU % is producing batches flat out
IDLE_WORKER_CPU = 30.0  # slow workers below this CPU % are waiting inside __getitem__
MAX_WAITING_WORKERS = 32


def settings_fix(loader: dict[str, Any], cost_ms: float | None = None,
                 period_ms: float | None = None, cpus: int | None = None,
                 cuda: bool = False, ranks: int | None = None) -> list[str]:
    """Fix lines that start from the loader's real settings (what to change, from what, to what).
    ``ranks``: how many ranks of the job share the machine's ``cpus`` (each starts its own
    workers, so each rank's advice is sized to its share)."""
    n = int(loader.get("num_workers") or 0)
    machine = f"this machine gives the job {cpus} CPUs" if cpus else ""
    if cpus and ranks and ranks > 1:
        machine += f", shared by its {ranks} ranks here: {max(1, cpus // ranks)} each"
        cpus = max(1, cpus // ranks)
    batch = loader.get("batch_size")
    workers = [w for it in loader.get("iterators") or [] for w in it.get("workers") or []]
    cpu = [float(w["cpu_percent"]) for w in workers if isinstance(w.get("cpu_percent"), (int, float))]
    busy = bool(cpu) and min(cpu) >= _BUSY_WORKER_CPU
    fix: list[str] = []
    if n == 0:
        fix.append("`num_workers=0`: every batch is loaded in the training loop itself. Set "
                   f"`DataLoader(..., num_workers={min(4, cpus or 4)})`"
                   + (f" ({machine})" if machine else "") + ".")
    elif cost_ms and period_ms and cost_ms > 0:
        # Workers deliver one batch per period between them: each needs n * period per batch.
        needed = math.ceil(n * period_ms / cost_ms)
        per_batch = n * period_ms
        cpus_text = ", ".join(f"{c:.0f}%" for c in cpu)
        head = (f"`num_workers={n}`: each worker needs about {per_batch:.0f} ms per batch of {batch} "
                f"while the step takes {cost_ms:.1f} ms")
        if busy:
            text = f"{head}, and the workers are busy ({cpus_text} CPU). "
            if cpus and needed > cpus:
                text += (f"Keeping up would take about {needed} workers, more than the {cpus} CPUs"
                         + (f" ({machine})" if ranks and ranks > 1 else "") + ": "
                         f"raise `num_workers` to {max(n + 1, cpus - 1)} and make `__getitem__` "
                         "cheaper (pre-process once and cache, decode smaller, augment batched on "
                         "the GPU).")
            else:
                text += f"Raise it to `num_workers={max(n + 1, needed)}`."
        elif cpu and max(cpu) < IDLE_WORKER_CPU:
            # Slow but idle workers wait inside __getitem__ (storage, network, a sleep): more
            # of them cost no CPU, so the CPU count is no limit.
            text = (f"{head}, yet the workers barely use the CPU ({cpus_text}): `__getitem__` waits "
                    f"(reading files, the network). Raise it to `num_workers={max(n + 1, min(needed, MAX_WAITING_WORKERS))}` "
                    "(waiting workers need no CPU), and cache or pre-fetch what it reads.")
        else:
            text = f"{head}. Raise it to `num_workers={max(n + 1, needed)}`" + (
                f" ({machine})." if machine else ".")
        fix.append(text)
    else:
        fix.append(f"`num_workers={n}`: raise it (up to the CPUs available) until the wait is gone.")
    if n > 0 and not loader.get("persistent_workers"):
        fix.append("`persistent_workers=True`: the workers are started again every epoch.")
    in_flight = [it.get("batches_in_flight") for it in loader.get("iterators") or []]
    pf = loader.get("prefetch_factor") or 2
    if n > 0 and cpu and not busy and in_flight and all(
            isinstance(f, int) and f < n * int(pf) for f in in_flight):
        fix.append(f"Fewer batches in flight ({in_flight[0]}) than the workers could prepare "
                   f"({n} x prefetch_factor {pf}): raise `prefetch_factor` to {int(pf) * 2} to "
                   "absorb bursts.")
    if cuda and not loader.get("pin_memory"):
        fix.append("`pin_memory=True` with `.to(device, non_blocking=True)` (currently "
                   "`pin_memory=False`).")
    return fix
