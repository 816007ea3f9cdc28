"""Findings from a live look at the training loop (diagnose's input phase): what share of the
loop the DataLoader takes, and whether the loop idles (sleeps, waits for I/O or a lock).

Inputs are plain data the agent returned: ``timing`` (every DataLoader ``next()`` timed over
whole batch periods, per thread, agent/dataloader_state.NextTimer), ``threads`` (stack samples:
shares per category and the places), ``loaders`` (their real settings), ``loop`` (the named
method's cost and period, from watch) and ``step`` (the step model of the profile, when one was
made: report/steps.py).

The DataLoader share is the timed one when there is one: it is what the loop itself would
measure (``data_time / batch_time``), without the profiler slowing the loop down. Failing that,
the stack samples' share of time in ``__next__``. The method's own share of its loop says
something only when the method is the step: a ``forward`` is a third of a healthy step, the rest
is backward and the optimizer, which is no idling. So idleness is read from the samples:
sleeping, waiting for I/O or a lock, never "running" (that is the step's own work), and the
place named is the program's own line, never an autograd or optimizer internal.

``graph_use`` (agent/graph_use.py): the named method's calls during the same window, and whether
a backward read the graphs they built. A call with grad on whose graph nobody read, while the
calls around it had theirs read, is an evaluation pass without ``torch.no_grad()``: work once an
epoch that a profile of a few steps only holds by chance.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.cost import cost_of
from flight_profiler.report.models import Finding
from flight_profiler.report.rules.dataloader_bottleneck import settings_fix, verdict
from flight_profiler.report.rules.eval_with_grad import FIXES as EVAL_FIXES
from flight_profiler.report.rules.eval_with_grad import ROOT as EVAL_ROOT
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

# Without timing: the method must take less than this share of its loop (when it is the step),
# and the samples must put this share of the thread's time in the DataLoader.
IDLE_SHARE = 0.5
LOADER_WAIT_SHARE = 0.3
# idle-loop: a warning from this share of the loop thread's time asleep or blocked, info from
# IDLE_INFO_SHARE; a loop that sleeps a little between steps may do so on purpose.
IDLE_WARNING_SHARE = 0.5
IDLE_INFO_SHARE = 0.2
IDLE = {"sleep": "sleeping", "io": "waiting for I/O", "wait": "waiting on a lock or queue"}
MIN_TIMED_BATCHES = 3
LOADER_CATEGORIES = ("dataloader_wait", "dataloader_load", "dataloader_receive")
# eval-with-grad from live calls: calls whose graphs no backward read (a validation pass is a
# run of them), among calls judged (a later call's graph was read meanwhile).
MIN_UNUSED_CALLS = 2


def _thread_of(threads: list[dict[str, Any]], name: str | None) -> dict[str, Any] | None:
    for t in threads:
        if t.get("thread") == name:
            return t
    return next(iter(threads), None)


def _timed(timing: list[dict[str, Any]], name: str | None) -> dict[str, Any] | None:
    rows = [r for r in timing if int(r.get("batches") or 0) >= MIN_TIMED_BATCHES
            and isinstance(r.get("share"), (int, float))]
    return next((r for r in rows if r.get("thread") == name), rows[0] if rows else None)


def _loader_lines(loader: dict[str, Any]) -> list[str]:
    ds = loader.get("dataset") or {}
    lines = [f"DataLoader over {ds.get('type')} (len {ds.get('length')}): batch_size="
             f"{loader.get('batch_size')}, num_workers={loader.get('num_workers')}, pin_memory="
             f"{loader.get('pin_memory')}, prefetch_factor={loader.get('prefetch_factor')}, "
             f"persistent_workers={loader.get('persistent_workers')}"]
    for it in loader.get("iterators") or []:
        ws = it.get("workers") or []
        if ws:
            lines.append("workers: " + "; ".join(
                f"pid {w.get('pid')} {w.get('state')}"
                + (f" {w['cpu_percent']:.0f}% CPU" if isinstance(w.get("cpu_percent"), (int, float)) else "")
                for w in ws) + f"; {it.get('batches_in_flight')} batches in flight")
    return lines


def dataloader_share(timing: list[dict[str, Any]], loop: dict[str, Any] | None,
                     ) -> dict[str, Any] | None:
    """The timed DataLoader share of the loop's thread (the method's, else the busiest)."""
    return _timed(timing, (loop or {}).get("thread"))


def timed_share(timed: dict[str, Any]) -> float:
    """The loop's DataLoader share as its own meter would read it over its run: over whole
    epochs where the window saw the workers start (agent/dataloader_state.NextTimer), else over
    the window."""
    return float(timed["share_epochs"] if isinstance(timed.get("share_epochs"), (int, float))
                 else timed["share"])


def epochs_phrase(timed: dict[str, Any]) -> str:
    return (f"a start of {float(timed.get('start_cost_s') or 0):.3f} s, iter() and the first "
            f"batch's wait, for each loader in every {timed.get('epoch_batches')} batches")


def _method_role(step: dict[str, Any] | None) -> str | None:
    return ((step or {}).get("method") or {}).get("role")


def dataloader_finding(timed: dict[str, Any] | None, loop: dict[str, Any] | None,
                       threads: list[dict[str, Any]], loaders: list[dict[str, Any]],
                       method: str | None, step: dict[str, Any] | None, cpus: int | None,
                       cuda: bool, inputs: list[str], ranks: int | None = None) -> Finding | None:
    loader = next((d for d in loaders if d.get("iterators")), loaders[0] if loaders else None)
    thread = _thread_of(threads, (loop or {}).get("thread") or (timed or {}).get("thread"))
    shares = (thread or {}).get("shares") or {}
    # In next(): waiting for a batch, loading one in this thread, or receiving one from a
    # worker (its tensors' shared memory fetched over a socket from the worker process, which
    # waits on that process as much as waiting for the batch does).
    waiting = sum(float(shares.get(k, 0.0)) for k in LOADER_CATEGORIES)
    evidence: list[str] = []
    if timed is not None:
        share = timed_share(timed)
        window_us = float(timed["window_s"]) * 1e6
        cost = cost_of(share * window_us, window_us, "loop time",
                       f"time in DataLoader next() (and iter(), starting an epoch and its workers) over "
                       f"{timed['batches']} whole batch periods of "
                       f"thread {timed['thread']!r}, timed without the profiler")
        taken = [f"{float(timed[k]):.2f} s of {what}" for k, what in
                 (("gc_s", "garbage collection"), ("hooks_s", "the agent's own hooks"))
                 if isinstance(timed.get(k), (int, float)) and float(timed[k]) >= 0.005]
        evidence.append(f"timed without the profiler: {timed['batches']} batches in "
                        f"{timed['window_s']:.2f} s, {timed['next_s']:.3f} s of it in next()"
                        + (f" and iter() ({timed['starts']} iter() starting an epoch: "
                           f"{float(timed.get('start_s') or 0):.3f} s)"
                           if isinstance(timed.get("starts"), int) else "") + ": "
                        f"{100 * float(timed['share']):.1f}% of the loop"
                        + (f" ({' and '.join(taken)} taken out of both)" if taken else "")
                        + (f"; {100 * share:.1f}% over whole epochs ({epochs_phrase(timed)})"
                           if "share_epochs" in timed else ""))
        if cost.pct < T.dataloader_min_pct:
            return None
        period = cost_ms = None
    elif loop is not None and (_method_role(step) in (None, "the step", "unknown")):
        busy = float(loop.get("busy_share", 1.0))
        if busy >= IDLE_SHARE or waiting < LOADER_WAIT_SHARE:
            return None
        period, cost_ms = float(loop["period_ms"]), float(loop["cost_ms"])
        cost = cost_of((period - cost_ms) * waiting * 1000.0, period * 1000.0, "loop time",
                       "the loop's time between calls, times the share of stack samples "
                       "waiting for the DataLoader")
        evidence.append(f"{method}: {loop['calls']} calls, median {cost_ms:.2f} ms each, one every "
                        f"{period:.1f} ms: the method is {busy:.0%} of its loop")
    elif thread is not None and int(thread.get("samples") or 0) >= 50 and waiting >= T.dataloader_min_pct / 100:
        # The method is a region of the step: the samples' share is the loop's share.
        cost = cost_of(waiting * 1e6, 1e6, "loop time",
                       f"share of {thread.get('samples')} stack samples of the loop's thread "
                       "inside DataLoader __next__")
        period = cost_ms = None
    else:
        return None
    if thread:
        evidence.append(f"thread {thread['thread']!r} over {thread.get('samples')} stack samples: "
                        + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    if loader is not None:
        evidence += _loader_lines(loader)
    top = next((p for p in (thread or {}).get("top") or [] if str(p.get("category", "")).startswith("dataloader")),
               None)
    where = [str(top["where"])] if top and top.get("where") else []
    fix = settings_fix(loader, cost_ms, period, cpus, cuda, ranks) if loader is not None else [
        "Load in parallel: `DataLoader(..., num_workers=N)`, `persistent_workers=True`."]
    title = (f"The loop waits for the DataLoader: {method} is only "
             f"{float((loop or {}).get('busy_share', 0)):.0%} of it" if period is not None else
             f"Waiting for the DataLoader takes {cost.pct:.1f}% of the loop")
    severity, borderline = verdict(cost)
    finding = Finding(
        rule="dataloader-bottleneck", severity=severity, cost=cost, title=title,
        summary=(f"The training loop spends {cost.pct:.1f}% of its time in DataLoader __next__ "
                 "waiting for the next batch." if period is None else
                 f"Between two calls of {method} ({cost_ms:.1f} ms) the loop spends "
                 f"{period - (cost_ms or 0.0):.0f} ms, {waiting:.0%} of its samples waiting in "
                 "DataLoader __next__ for the next batch."),
        evidence=evidence, where=where, fix=fix, inputs=inputs,
        root_cause="Batches are produced more slowly than the model consumes them.",
        metrics={"dataloader_share": round(cost.pct / 100, 4), "dataloader_wait_share": waiting,
                 **({"timed": timed} if timed is not None else {}),
                 **({"busy_share": loop.get("busy_share"), "period_ms": period, "cost_ms": cost_ms}
                    if loop is not None and period is not None else {})})
    if borderline:
        finding.mark_borderline(borderline)
    return finding


def idle_finding(loop: dict[str, Any] | None, threads: list[dict[str, Any]], method: str | None,
                 inputs: list[str]) -> Finding | None:
    """The loop thread asleep or blocked (not in the DataLoader) for a large share of its time."""
    if loop is None:
        return None
    thread = _thread_of(threads, loop.get("thread"))
    if thread is None:
        return None
    shares = thread.get("shares") or {}
    idle = sum(float(shares.get(k, 0.0)) for k in IDLE)
    if idle < IDLE_INFO_SHARE:
        return None
    places = [p for p in thread.get("top") or [] if p.get("category") in IDLE]
    top = places[0] if places else {}
    what = IDLE.get(str(top.get("category")), "idle")
    where = str(top.get("where", "the loop"))
    return Finding(
        rule="idle-loop", severity="warning" if idle >= IDLE_WARNING_SHARE else "info",
        cost=cost_of(idle * 1e6, 1e6, "loop time",
                     f"share of {thread.get('samples')} stack samples of thread "
                     f"{thread.get('thread')!r} asleep or blocked (not in the DataLoader)"),
        title=f"The training loop is {what} {idle:.0%} of the time",
        summary=(f"Over {thread.get('samples')} stack samples of thread {thread.get('thread')!r} "
                 f"(the one calling {method}), {idle:.0%} were {what}, mostly at {where}: "
                 "time in which it does no training."),
        evidence=[f"thread {thread['thread']!r} over {thread.get('samples')} stack samples: "
                  + ", ".join(f"{k} {v:.0%}" for k, v in shares.items())]
        + [f"{p.get('where')}: {float(p.get('share', 0)):.0%} of the samples" for p in places[:3]],
        where=[where],
        fix=[f"Look at {where}: {what} between steps does no training. Overlap it with the step "
             "(a background thread, or a DataLoader with workers for input), or drop it if it "
             "is not needed."],
        inputs=inputs,
        root_cause="The loop waits outside its training work (sleep, I/O, a lock).",
        metrics={"idle_share": round(idle, 4), "busy_share": loop.get("busy_share")},
    )


def _int(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def graph_use_finding(use: dict[str, Any] | None, inputs: list[str]) -> Finding | None:
    """eval-with-grad: calls of the method that built graphs no backward read, among calls whose
    graphs were read (a training loop): an evaluation pass with autograd on."""
    if not isinstance(use, dict):
        return None
    unused, judged, used = _int(use.get("unused")), _int(use.get("judged")), _int(use.get("used"))
    if unused < MIN_UNUSED_CALLS or used < 1:
        return None
    places = [p for p in use.get("unused_where") or [] if isinstance(p, dict)]
    where = [f"{p.get('function')} at {str(p.get('file')).rsplit('/', 1)[-1]}:{p.get('line')} "
             f"({_int(p.get('calls'))} of the calls)" for p in places]
    target = str(use.get("target") or "the method")
    per_call = _int(use.get("unused_saved_bytes_per_call"))
    window = use.get("window_s")
    return Finding(
        rule="eval-with-grad", severity="warning",
        title="a forward pass runs with autograd on and no backward uses its graph",
        summary=(f"{unused} of {judged} calls of {target} watched live over {window} s built a "
                 f"graph ({fmt_bytes(per_call)} of activations saved per call) that no backward "
                 f"ever read, while the other {used} were read by the training step's backward"
                 + (f"; they were called from {where[0]}" if where else "")
                 + ": an evaluation pass without torch.no_grad() keeps activations alive for a "
                 "backward that never comes and pays autograd's cost for nothing."),
        evidence=[f"{target}: {_int(use.get('calls'))} calls in {window} s, "
                  f"{_int(use.get('grad_calls'))} with grad on, {_int(use.get('no_grad_calls'))} "
                  f"without; of the {judged} judged (a later call's graph was read), {unused} "
                  f"never read by a backward, up to {_int(use.get('longest_unused_run'))} in a row",
                  *(f"called from {p.get('file')}:{p.get('line')} ({p.get('function')}): "
                    f"{_int(p.get('calls'))} unread graphs" for p in places)],
        where=where or [target], root_cause=EVAL_ROOT, fix=EVAL_FIXES, inputs=inputs,
        metrics={"unused_calls": unused, "judged_calls": judged, "used_calls": used,
                 "longest_unused_run": _int(use.get("longest_unused_run")),
                 "unused_saved_bytes_per_call": per_call, "source": "live calls"},
    )


SET_EPOCH_FIX = [
    "Call `sampler.set_epoch(epoch)` at the start of every epoch, before `for batch in loader`: "
    "PyTorch's DistributedSampler documentation says calling it before creating the DataLoader "
    "iterator is necessary to make shuffling work properly across epochs.",
    "Keep the sampler at hand for it (`train_loader.sampler.set_epoch(epoch)`), on every rank.",
]


def set_epoch_finding(loaders: list[dict[str, Any]], inputs: list[str]) -> Finding | None:
    """missing-set-epoch: a training loader's shuffling DistributedSampler began a new epoch, in
    the window, at the epoch value of the one before (agent/dataloader_state._follow_epochs)."""
    for loader in loaders:
        sampler = loader.get("sampler") if isinstance(loader, dict) else None
        if not isinstance(sampler, dict) or not sampler.get("distributed") or sampler.get("shuffle") is not True:
            continue
        unchanged, backwards = _int(sampler.get("unchanged_at_starts")), _int(sampler.get("backward_passes"))
        if unchanged < 1 or backwards < 1:
            continue  # not seen beginning an epoch unchanged, or not the loader trained on
        dataset = loader.get("dataset") or {}
        name = str(dataset.get("type") or "a dataset").rsplit(".", 1)[-1]
        epochs = sampler.get("epochs_at_starts") or []
        return Finding(
            rule="missing-set-epoch", severity="warning",
            title="DistributedSampler.set_epoch is never called: every epoch shuffles the same way",
            summary=(f"The training loader over {name} began {unchanged} new epoch(s) while watched "
                     f"with its DistributedSampler's epoch still {sampler.get('epoch')}, the value "
                     "of the epoch before. The sampler shuffles with seed + epoch, so without "
                     "`set_epoch` every epoch visits the samples in the same order, on every rank "
                     f"of the {sampler.get('num_replicas')}: the shuffle is done once, not per epoch."),
            evidence=[f"DataLoader over {name} ({dataset.get('length')} samples, batch_size "
                      f"{loader.get('batch_size')}): DistributedSampler(shuffle=True), rank "
                      f"{sampler.get('rank')} of {sampler.get('num_replicas')}; epoch "
                      f"{sampler.get('epoch')} inside an epoch when the window began, then "
                      f"{', '.join(str(e) for e in epochs)} as each of the "
                      f"{_int(sampler.get('starts_seen'))} next epoch(s) began (iter(loader))",
                      f"{backwards} backward passes on its batches in the window: the loader the "
                      "model is trained on"],
            where=[f"the loop over the DataLoader of {name}"],
            root_cause=("DistributedSampler draws each epoch's permutation from a generator seeded "
                        "with seed + epoch; epoch changes only through set_epoch()."),
            fix=SET_EPOCH_FIX, inputs=inputs,
            metrics={"unchanged_epochs": unchanged, "sampler_epoch": sampler.get("epoch"),
                     "backward_passes": backwards, "source": "live epochs"})
    return None

