"""The rank the others wait for (job-straggler), from per-rank traces, Flight Recorder and stacks.

In a synchronous job every step takes as long as the slowest rank's, so step times cannot tell
ranks apart: the others spend the difference waiting for it in a collective. From per-rank
traces of the same window (``distributedInfo.rank``, or ``rank<N>`` in the file name), each
rank's window is split into its waits for the others (explicit collectives, and DDP's gradient
all-reduce inside backward: job_work.py) and its own work (compute, DataLoader waits, sleeps,
waits for another thread of its own, other Python). A rank whose share in waits is
``straggler_wait_gap_pct`` points below the median of the others', with ``straggler_own_ratio``
times their own work, is the straggler, and its largest excess over the others (computing
longer, loading data, sleeping...) at the program's line where it happens is the cause. Flight
Recorder (which rank enqueues each collective last) and the stack samples (where the others
wait, where it is) go into the evidence; without traces, Flight Recorder alone can name it.

Traces without the waits measured (no Python frames and no collective span) fall back to
comparing compute shares (``straggler_clear_ratio``).
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.job_metrics import is_comm
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context
from flight_profiler.report.rules.job_common import JT, by_rank, median
from flight_profiler.report.rules.job_fr import FlightRecorder, lag_lines, ranks_text
from flight_profiler.report.units import fmt_pct, fmt_us

OWN = ("compute", "data", "sleep", "blocked", "other")
_DOING = {
    "compute": "computes longer",
    "data": "waits for the DataLoader",
    "sleep": "sleeps",
    "blocked": "waits for another thread of its own (a queue, a lock)",
    "other": "runs Python between operators",
    "outside": "spends the difference outside the profiled steps",
    "slower": "runs the same operators slower than the others",
}


def rank_figures(traces: list[InputResult]) -> dict[int, dict[str, Any]]:
    """Per rank: shares of its window in waits and in each kind of its own work, the program's
    lines behind them, step times, heaviest operators."""
    out: dict[int, dict[str, Any]] = {}
    for rank, inputs in by_rank(traces).items():
        sums: dict[str, float] = {}
        steps: list[float] = []
        ops: dict[str, float] = {}
        lines: dict[tuple[str, str], float] = {}
        measured = gpu = ddp = steps_window = False
        elsewhere = 0.0
        n_steps = n_ops = 0
        for inp in inputs:
            d = inp.data.get("distributed")
            if not isinstance(d, dict) or not d.get("span_us"):
                continue
            for k in ("compute_us", "collective_us", "span_us"):
                sums[k] = sums.get(k, 0.0) + float(d.get(k) or 0.0)
            gpu = gpu or d.get("source") == "gpu"
            w = d.get("work")
            if isinstance(w, dict) and w.get("window_us"):
                measured = measured or bool(w.get("python_frames"))
                steps_window = steps_window or w.get("window_kind") == "steps"
                ddp = ddp or bool(w.get("ddp"))
                for k in ("window_us", "wait_us", *(f"{x}_us" for x in OWN)):
                    sums["w_" + k] = sums.get("w_" + k, 0.0) + float(w.get(k) or 0.0)
                n_steps += int(w.get("steps") or 0)
                n_ops += int(w.get("ops") or 0)
                elsewhere = max(elsewhere, float(w.get("data_elsewhere_pct") or 0.0))
                share = float(w["window_us"])
                for line in w.get("lines", []):
                    key = (str(line.get("kind")), str(line.get("where")))
                    lines[key] = lines.get(key, 0.0) + float(line.get("pct", 0.0)) * share / 100.0
            steps.extend(float(x) for x in (inp.data.get("steps") or {}).get("durations_us", []))
            for op in inp.data.get("top_operators", []):
                if not is_comm(str(op.get("name", ""))):
                    ops[op["name"]] = ops.get(op["name"], 0.0) + float(op.get("self_us", 0.0))
        span = sums.get("span_us", 0.0)
        if span <= 0:
            continue
        window = sums.get("w_window_us", 0.0)
        fig: dict[str, Any] = {
            "compute_pct": 100.0 * sums["compute_us"] / span,
            "collective_pct": 100.0 * sums["collective_us"] / span,
            "compute_us": sums["compute_us"], "collective_us": sums["collective_us"],
            "span_us": span, "steps": steps, "ddp": ddp,
            "step_mean_us": sum(steps) / len(steps) if steps else
            (window / n_steps if window and n_steps else None),
            "top_ops": sorted(ops.items(), key=lambda kv: -kv[1])[:3],
            "inputs": [i.path for i in inputs], "measured": measured and not gpu,
            "data_elsewhere_pct": elsewhere, "steps_window": steps_window,
            "lines": {k: 100.0 * v / window for k, v in lines.items()} if window else {},
        }
        if window > 0 and measured and not gpu:
            fig["wait_pct"] = 100.0 * sums["w_wait_us"] / window
            for k in OWN:
                fig[f"{k}_pct"] = 100.0 * sums[f"w_{k}_us"] / window
        else:
            # No Python frames, or a GPU: the collectives' own spans (NCCL kernels, gloo spans)
            # include the wait for the others.
            fig["wait_pct"] = fig["collective_pct"]
            for k in ("data", "sleep", "blocked"):
                fig[f"{k}_pct"] = 0.0
            fig["other_pct"] = max(0.0, 100.0 - fig["wait_pct"] - fig["compute_pct"])
        fig["own_pct"] = max(0.0, 100.0 - fig["wait_pct"])
        # Per step, in microseconds: windows of method calls differ in length from rank to rank
        # (the waiting ranks' calls last longer), shares of them do not compare; a step does.
        length = window if window > 0 and measured and not gpu else span
        count = n_steps or len(steps)
        fig["step_us"] = length / count if count else length
        fig["ops_per_step"] = n_ops / count if count else float(n_ops)
        for k in ("wait", "own", *OWN):
            fig[f"{k}_step_us"] = fig[f"{k}_pct"] * fig["step_us"] / 100.0
        out[rank] = fig
    return out


def _gap(rank: int, figs: dict[int, dict[str, Any]]) -> float:
    """How much longer the other ranks wait per step than this one (microseconds)."""
    return median([g["wait_step_us"] for r, g in figs.items() if r != rank]) - float(figs[rank]["wait_step_us"])


def slow_ranks(figs: dict[int, dict[str, Any]]) -> list[int]:
    """The ranks the others wait for (none when more than half qualify: no outlier).

    The others wait ``straggler_wait_gap_pct`` of a step longer than it does, and it works
    ``straggler_own_ratio`` times longer than they do, or (traces of a method's calls only) its
    extra work is outside the calls, where no trace sees it."""
    slow: list[int] = []
    step = median([g["step_us"] for g in figs.values()])
    waits_measured = max(g["wait_pct"] for g in figs.values()) >= 1.0
    for rank, f in figs.items():
        others = [g for r, g in figs.items() if r != rank]
        if waits_measured:
            if step <= 0 or 100.0 * _gap(rank, figs) / step < JT.straggler_wait_gap_pct:
                continue
            base = median([g["own_step_us"] for g in others])
            if f["steps_window"] or f["own_step_us"] >= JT.straggler_own_ratio * base:
                slow.append(rank)
        else:
            base = median([g["compute_pct"] for g in others])
            if (base > 0 and f["compute_pct"] >= JT.straggler_clear_ratio * base
                    and f["compute_pct"] - base >= JT.straggler_min_share_pct):
                slow.append(rank)
    return [] if not slow or len(slow) * 2 > len(figs) else slow


def _cause(r: int, figs: dict[int, dict[str, Any]]) -> tuple[str, float, str | None]:
    """The kind of own work rank r does most beyond the others, by how much per step
    (microseconds), and the program's line where it does it."""
    others = [g for k, g in figs.items() if k != r]
    excess = {k: figs[r][f"{k}_step_us"] - median([g[f"{k}_step_us"] for g in others]) for k in OWN}
    kind = max(excess, key=excess.__getitem__)
    if excess[kind] <= 0:
        kind = "compute"
    lines = sorted(((w, pct) for (k, w), pct in figs[r]["lines"].items() if k == kind),
                   key=lambda kv: -kv[1])
    return kind, excess[kind], lines[0][0] if lines else None


def _more_work(r: int, figs: dict[int, dict[str, Any]]) -> bool:
    """Rank r runs more operators per step than the others (extra work, not the same work
    running slower)."""
    base = median([g["ops_per_step"] for k, g in figs.items() if k != r])
    extra = figs[r]["ops_per_step"] - base
    return base <= 0 or extra >= max(JT.straggler_extra_ops, JT.straggler_extra_ops_pct * base / 100.0)


def _wait_line(g: dict[str, Any]) -> str | None:
    lines = sorted(((w, pct) for (k, w), pct in g["lines"].items() if k == "wait"),
                   key=lambda kv: -kv[1])
    return lines[0][0] if lines else None


def _stack_sites(ctx: Context, ranks: list[int], waiting: bool) -> list[str]:
    """Where the ranks were in their stack samples: the slow ones outside collectives, the
    others in them (what they wait in)."""
    from collections import Counter

    from flight_profiler.report.rank_stacks import rank_position

    per = by_rank(ctx.stacks)
    out: list[str] = []
    for r in ranks:
        seen: Counter[str] = Counter()
        total = 0
        for inp in per.get(r, []):
            for sample in inp.data.get("samples", []):
                total += 1
                p = rank_position(sample)
                if (p.kind in ("collective", "backward")) == waiting:
                    seen[p.describe()] += 1
        out.extend(f"rank {r}: {site} ({n} of {total} stack samples)" for site, n in seen.most_common(2))
    return out


def _seen_at(ctx: Context, r: int) -> str | None:
    """Where the stack samples saw rank r outside collectives, when most of them saw it at the
    same place (one sample of three is what a busy host shows too)."""
    from collections import Counter

    from flight_profiler.report.rank_stacks import rank_position

    seen: Counter[str] = Counter()
    total = 0
    for inp in by_rank(ctx.stacks).get(r, []):
        for sample in inp.data.get("samples", []):
            total += 1
            p = rank_position(sample)
            if p.kind not in ("collective", "backward", "idle"):
                seen[f"{p.function} ({p.where})"] += 1
    if not seen:
        return None
    place, n = seen.most_common(1)[0]
    return place if 2 * n > total else None


def _evidence(figs: dict[int, dict[str, Any]]) -> list[str]:
    out = []
    for r, g in sorted(figs.items()):
        step = f", step {fmt_us(g['step_mean_us'])}" if g["step_mean_us"] else ""
        if g["measured"]:
            own = ", ".join(f"{k} {fmt_pct(g[f'{k}_pct'])}" for k in OWN)
            via = " (DDP's gradient all-reduce in backward, and collectives)" if g["ddp"] else ""
            out.append(f"rank {r}: waits for the others {fmt_pct(g['wait_pct'])} of its window{via}; "
                       f"its own work: {own}{step}")
        else:
            out.append(f"rank {r}: compute {fmt_pct(g['compute_pct'])} of its window "
                       f"({fmt_us(g['compute_us'])}), in collectives {fmt_pct(g['collective_pct'])}{step}")
    means = [g["step_mean_us"] for g in figs.values() if g["step_mean_us"]]
    if len(means) >= 2:
        out.append(f"step time per rank: max {fmt_us(max(means))}, min {fmt_us(min(means))} (not "
                   "who is slow: in a synchronous job the others' steps last as long as the slow "
                   "rank's, waiting; over a method's calls the waiting ranks' calls last longer)")
    return out[:64]


def straggler_findings(ctx: Context, figs: dict[int, dict[str, Any]], fr: FlightRecorder,
                       fr_note: str | None) -> list[Finding]:
    slow = slow_ranks(figs) if len(figs) >= 2 else []
    if not slow:
        return _from_flight_recorder(ctx, fr) if len(figs) < 2 else []
    worst = max(slow, key=lambda r: _gap(r, figs))
    kind, excess, line = _kind(ctx, worst, figs)
    busy: list[int] = []
    if kind != "slower":
        # A rank that only runs the same operators slower (a busy host's cores) is not named
        # beside one with work of its own to show: alone it would be said, not warned about.
        busy = [r for r in slow if r != worst and _kind(ctx, r, figs)[0] == "slower"]
        slow = [r for r in slow if r not in busy]
    fast = [r for r in figs if r not in slow]
    w = figs[worst]
    others_wait = median([figs[r]["wait_pct"] for r in fast])
    gap = _gap(worst, figs)
    # No extra work to show (the same operators, slower; or time between the method's calls that
    # no sample placed): a busy host does that too, so it is said, not warned about.
    severity = "info" if kind == "slower" or (kind == "outside" and line is None) else "warning"
    doing = _DOING[kind] + (f" at {line}" if line else "")
    fed = ""
    if kind == "blocked" and w["data_elsewhere_pct"] >= 50.0:
        fed = (f"; another thread of it (a prefetcher feeding that queue) waits for the "
               f"DataLoader {fmt_pct(w['data_elsewhere_pct'])} of the window: data loading")
    where = []
    if line and kind == "outside":
        where.append(f"rank {worst}: {line} (where its stack samples saw it between the profiled steps)")
    elif line:
        where.append(f"rank {worst}: {line} ({kind}: {fmt_pct(w['lines'].get((kind, line), 0.0))} "
                     "of its window)")
    for r in fast[:4]:
        wl = _wait_line(figs[r])
        if wl:
            what = "DDP's gradient all-reduce (in backward)" if figs[r]["ddp"] else "collectives"
            where.append(f"rank {r} waits at {wl} in {what}")
    where += _stack_sites(ctx, slow, waiting=False) + _stack_sites(ctx, fast[:2], waiting=True)
    if kind in ("compute", "slower"):
        where += [f"rank {r}: {name} ({fmt_us(us)} self time)" for r in slow for name, us in figs[r]["top_ops"]]
    evidence = _evidence(figs) + _fr_agreement(fr, slow) + lag_lines(fr)
    evidence += [f"rank {r} also waits less than the others ({fmt_pct(figs[r]['wait_pct'])} of its "
                 "window) but runs no more work: the same operators, slower (its host's load); "
                 "not named" for r in busy]
    if fr_note:
        evidence.append(fr_note)
    return [Finding(
        rule="job-straggler", severity=severity,
        title=(f"{ranks_text(slow).capitalize()} "
               + (f"{'is the straggler' if len(slow) == 1 else 'are stragglers'}" if severity != "info"
                  else f"{'was' if len(slow) == 1 else 'were'} the slowest in the profiled window")
               + f": the others wait for {'it' if len(slow) == 1 else 'them'} {fmt_us(gap)} a step; "
               f"it {doing}"),
        summary=(f"{ranks_text(fast).capitalize()} {'spends' if len(fast) == 1 else 'spend'} "
                 f"{fmt_pct(others_wait)} of {'its' if len(fast) == 1 else 'their'} window waiting "
                 f"for the others, rank {worst} {fmt_pct(w['wait_pct'])}: about {fmt_us(gap)} a step "
                 f"more, waiting for it. Rank {worst} {doing} ({fmt_us(excess)} a step more than "
                 f"the others){fed}. Every synchronous collective runs the job at the slowest "
                 "rank's pace."),
        evidence=evidence, where=where[:16],
        fix=_fix(kind),
        root_cause="The other ranks finish their step first and wait in the collective for the "
                   "slow one.",
        inputs=[p for r in slow for p in figs[r]["inputs"]], ranks=slow,
        metrics={"ranks": {str(r): {k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in g.items()
                                    if k not in ("steps", "inputs", "top_ops", "lines")}
                           for r, g in sorted(figs.items())},
                 "cause": kind, "line": line, "waiting_ranks": sorted(fast),
                 "wait_gap_us_per_step": round(gap, 3), "excess_us_per_step": round(excess, 3),
                 "compute_ratio": _ratio(worst, figs),
                 "flight_recorder_latest": fr.latest()},
    )]


def _kind(ctx: Context, r: int, figs: dict[int, dict[str, Any]]) -> tuple[str, float, str | None]:
    """What slow rank r does with the time the others wait for it (a kind of :data:`_DOING`),
    by how much per step, and where."""
    kind, excess, line = _cause(r, figs)
    gap = _gap(r, figs)
    if figs[r]["steps_window"] and excess < 0.5 * gap:
        # Traces of the method's calls only: what the others wait for happens between them.
        kind, excess, line = "outside", gap, _seen_at(ctx, r)
    if kind in ("compute", "other") and not _more_work(r, figs):
        kind, line = "slower", None
    return kind, excess, line


def _ratio(r: int, figs: dict[int, dict[str, Any]]) -> float | None:
    base = median([g["compute_pct"] for k, g in figs.items() if k != r])
    return round(figs[r]["compute_pct"] / base, 3) if base > 0 else None


def _fr_agreement(fr: FlightRecorder, slow: list[int]) -> list[str]:
    latest = fr.latest()
    if latest is None:
        return []
    if latest in slow:
        return [f"Flight Recorder agrees: rank {latest} enqueued most collectives last"]
    return [f"Flight Recorder disagrees: rank {latest} enqueued most collectives last (its "
            "samples were taken before the profile: the job may have changed meanwhile)"]


def _from_flight_recorder(ctx: Context, fr: FlightRecorder) -> list[Finding]:
    """No traces to compare: Flight Recorder alone says who the others wait for."""
    from flight_profiler.report.rules.job_stacks import latest

    r = fr.latest()
    if r is None or fr.lags[r]["lag_us"] < JT.straggler_fr_lag_us:
        return []
    got = fr.lags[r]
    sites = _stack_sites(ctx, [r], waiting=False)
    stacks = by_rank(ctx.stacks)
    return [Finding(
        rule="job-straggler", severity="warning",
        title=(f"Rank {r} is the straggler: it enqueued {int(got['last'])} of the last "
               f"{int(got['of'])} collectives last, a median {fmt_us(got['lag_us'])} after the first rank"),
        summary=(f"Flight Recorder's timestamps of the same collectives on every rank: rank {r} "
                 f"enqueues them last, so the others wait for it about {fmt_us(got['lag_us'])} "
                 "in each. Profile every rank (`diagnose PID --all-ranks`) to see what it spends "
                 "that time in."),
        evidence=lag_lines(fr) + sites, where=sites[:4],
        fix=_fix("compute"),
        root_cause="The other ranks reach each collective first and wait for the slow one.",
        inputs=[latest(stacks[k]).path for k in sorted(stacks)], ranks=[r],
        metrics={"flight_recorder_lags": {str(k): v for k, v in fr.lags.items()}},
    )]


def _fix(kind: str) -> list[str]:
    specific = {
        "outside": "Profile the whole loop, not only the method (`diagnose PID --all-ranks` "
                   "without a method profiles a window of every thread), or look at the line "
                   "under `where`: the slow rank's extra time is between the calls.",
        "compute": "Make the slow rank's extra work go away: uneven batch sizes or sequence lengths "
                   "per rank, rank-0-only logging, metrics or evaluation inside the step, a slower "
                   "device or a busy host (its line and heaviest operators are under `where`).",
        "data": "Feed the slow rank faster: more DataLoader workers, a cheaper __getitem__, its "
                "data on a faster disk; check its shard is not bigger than the others'.",
        "sleep": "Remove the sleep from the step, or move it (and the I/O it waits for: a metrics "
                 "store, a checkpoint) to a background thread.",
        "blocked": "Find what the thread it waits for is doing (`flight_profiler PID --ranks N "
                   "--cmd stack`): a prefetcher starved by the DataLoader, a lock held elsewhere.",
        "other": "Move the Python work between operators out of the step (logging, .item() "
                 "calls, per-sample Python loops).",
        "slower": "Its operators are the others' but take longer: check that rank's host (other "
                  "processes on its cores, a slower device, throttling) and its inputs (bigger "
                  "batches or longer sequences than the others': balance them).",
    }
    return [specific[kind],
            "Balance the data: equal-size shards (DistributedSampler), bucketing by length.",
            "If the host is shared, pin each rank to its own cores (OMP_NUM_THREADS, taskset)."]
