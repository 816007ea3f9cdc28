"""dataloader-bottleneck: the step waits for the DataLoader's next batch.

Share = time in ``enumerate(DataLoader)#...__next__`` annotations inside ProfilerSteps / total
step time (trace window without steps). torch-tb-profiler recommended more workers above 5 %.

From live evidence (``from_live``, used by diagnose): the method observed with watch takes less
than half of its loop, and stack samples of its thread show where the rest goes (a DataLoader
wait, a sleep, I/O); the fix starts from the loader's real settings (``settings_fix``).
"""

from __future__ import annotations

import math
from typing import Any

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


# -- from live evidence (diagnose): the method's share of its loop + the loaders' settings ----
# The method must take less than this share of its loop before the rest is called a stall; the
# sampled stacks must show the DataLoader wait for at least this share of the thread's time.
IDLE_SHARE = 0.5
LOADER_WAIT_SHARE = 0.3
_BUSY_WORKER_CPU = 70.0  # a worker above this CPU % is producing batches flat out
IDLE_WARNING_SHARE = 0.2  # idle-loop (not the DataLoader): a warning below this share
IDLE_WORKER_CPU = 30.0  # slow workers below this CPU % are waiting inside __getitem__
MAX_WAITING_WORKERS = 32


def settings_fix(loader: dict[str, Any], cost_ms: float | None = None,
                 period_ms: float | None = None, cpus: int | None = None,
                 cuda: bool = False) -> list[str]:
    """Fix lines that start from the loader's real settings (what to change, from what, to what)."""
    n = int(loader.get("num_workers") or 0)
    batch = loader.get("batch_size")
    workers = [w for it in loader.get("iterators") or [] for w in it.get("workers") or []]
    cpu = [float(w["cpu_percent"]) for w in workers if isinstance(w.get("cpu_percent"), (int, float))]
    busy = bool(cpu) and min(cpu) >= _BUSY_WORKER_CPU
    fix: list[str] = []
    if n == 0:
        fix.append("`num_workers=0`: every batch is loaded in the training loop itself. Set "
                   f"`DataLoader(..., num_workers={min(4, cpus or 4)})`"
                   + (f" (this machine gives the job {cpus} CPUs)" if cpus else "") + ".")
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
                text += (f"Keeping up would take about {needed} workers, more than the {cpus} CPUs: "
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
                f" (this machine gives the job {cpus} CPUs)." if cpus else ".")
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


def _thread_of(threads: list[dict[str, Any]], name: str | None) -> dict[str, Any] | None:
    for t in threads:
        if t.get("thread") == name:
            return t
    return next(iter(threads), None)


def from_live(loop: dict[str, Any], threads: list[dict[str, Any]], loaders: list[dict[str, Any]],
              method: str, cpus: int | None = None, cuda: bool = False,
              inputs: list[str] | None = None) -> Finding | None:
    """The method runs a small share of its loop: say where the rest goes, and the fix."""
    share = float(loop.get("busy_share", 1.0))
    if share >= IDLE_SHARE:
        return None
    thread = _thread_of(threads, loop.get("thread"))
    shares = (thread or {}).get("shares") or {}
    top = ((thread or {}).get("top") or [{}])[0]
    period, cost = float(loop["period_ms"]), float(loop["cost_ms"])
    evidence = [f"{method}: {loop['calls']} calls, median {cost:.2f} ms each, one every "
                f"{period:.1f} ms: the method is {share:.0%} of its loop"]
    if thread:
        evidence.append(f"thread {thread['thread']!r} over {thread.get('samples')} stack samples: " +
                        ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    waiting = float(shares.get("dataloader_wait", 0.0)) + float(shares.get("dataloader_load", 0.0))
    loader = next((d for d in loaders if d.get("iterators")), loaders[0] if loaders else None)
    if waiting >= LOADER_WAIT_SHARE and loader is not None:
        ds = loader.get("dataset") or {}
        evidence.append(
            f"DataLoader over {ds.get('type')} (len {ds.get('length')}): batch_size="
            f"{loader.get('batch_size')}, num_workers={loader.get('num_workers')}, pin_memory="
            f"{loader.get('pin_memory')}, prefetch_factor={loader.get('prefetch_factor')}, "
            f"persistent_workers={loader.get('persistent_workers')}")
        for it in loader.get("iterators") or []:
            ws = it.get("workers") or []
            if ws:
                evidence.append("workers: " + "; ".join(
                    f"pid {w.get('pid')} {w.get('state')}"
                    + (f" {w['cpu_percent']:.0f}% CPU" if isinstance(w.get("cpu_percent"), (int, float)) else "")
                    for w in ws) + f"; {it.get('batches_in_flight')} batches in flight")
        return Finding(
            rule="dataloader-bottleneck", severity="critical" if share < 0.2 else "warning",
            cost=cost_of((period - cost) * waiting * 1000.0, period * 1000.0, "loop time",
                         "the loop's time between calls, times the share of stack samples "
                         "waiting for the DataLoader"),
            title=f"The loop waits for the DataLoader: {method} is only {share:.0%} of it",
            summary=(f"Between two calls of {method} ({cost:.1f} ms) the loop spends "
                     f"{period - cost:.0f} ms, {waiting:.0%} of its samples waiting in DataLoader "
                     "__next__ for the next batch."),
            evidence=evidence, where=[str(top.get("where", ""))] if top.get("where") else [],
            fix=settings_fix(loader, cost, period, cpus, cuda),
            inputs=list(inputs or []),
            root_cause="Batches are produced more slowly than the model consumes them.",
            metrics={"busy_share": share, "period_ms": period, "cost_ms": cost,
                     "dataloader_wait_share": waiting},
        )
    category = str(top.get("category", "running"))
    what = {"sleep": "sleeping", "io": "waiting for I/O", "wait": "waiting on a lock or queue",
            "running": "running other code"}.get(category, category)
    # Not the DataLoader: its own rule id. A warning only when the method is a sliver of its
    # loop; a loop that sleeps a little between steps may do so on purpose.
    return Finding(
        rule="idle-loop", severity="warning" if share < IDLE_WARNING_SHARE else "info",
        title=f"{method} is only {share:.0%} of its loop: the rest is spent {what}",
        summary=(f"Between two calls of {method} ({cost:.1f} ms) the loop spends "
                 f"{period - cost:.0f} ms; the sampled stacks put it at {top.get('where', '?')}."),
        evidence=evidence, where=[str(top.get("where", ""))] if top.get("where") else [],
        fix=[f"Look at {top.get('where', 'the loop')}: {what} between steps does no training. "
             "Overlap it with the step (a background thread or a DataLoader with workers), or "
             "remove it."],
        inputs=list(inputs or []),
        root_cause="The step is idle most of the time: the loop waits outside the method.",
        metrics={"busy_share": share, "period_ms": period, "cost_ms": cost},
    )
