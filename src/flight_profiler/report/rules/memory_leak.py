"""memory-leak: allocated memory that grows step after step and is never given back.

Three sources: a trace's ``[memory]`` events (least-squares slope of allocated memory at the end
of each ProfilerStep, with the allocations still alive at the end, by Python line), several
snapshots of one process (allocated bytes by allocation site, up at every one of three or more),
several censuses of one process (tensor bytes by holder, judged per holder by census_growth.py:
three points or more, not capped, still holding what it held). A pair of snapshots or censuses
that grew is an info finding: two points cannot tell a leak from a cache filling up.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report import census_growth
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

FIX = [
    "Do not keep tensors from one step to the next: store `loss.item()` (a float) or "
    "`t.detach().cpu()` in histories, not the tensor itself.",
    "Bound caches and lists that grow every step (a `collections.deque(maxlen=N)`, or clear them).",
    "Check the growing sites/holders named above first: they are where the surviving "
    "memory was allocated or is held.",
]


def _from_traces(ctx: Context) -> list[Finding]:
    out = []
    for tr in ctx.traces:
        for dev, mem in (tr.data.get("memory") or {}).items():
            steps = mem.get("per_step_allocated") or []
            slope = mem.get("slope_bytes_per_step", 0.0)
            r2 = mem.get("slope_r2", 0.0)
            if len(steps) < T.leak_min_steps or slope < T.leak_min_bytes_per_step or r2 < T.leak_min_r2:
                continue
            first, last = steps[0][1], steps[-1][1]
            grow_pct = 100.0 * (last - first) / first if first else 100.0
            sev = "critical" if grow_pct >= 50 else "warning"
            where = [f"{r['where']} via {r['operator']}: {r['count']} allocations, "
                     f"{fmt_bytes(r['bytes'])} still alive" for r in mem.get("surviving_allocations", [])[:5]]
            out.append(Finding(
                rule="memory-leak", severity=sev,
                title=f"Allocated {dev} memory grows {fmt_bytes(slope)} per step",
                summary=(f"{label(tr)}: allocated memory on {dev} rose from {fmt_bytes(first)} to "
                         f"{fmt_bytes(last)} over {len(steps)} steps ({fmt_bytes(slope)}/step, "
                         f"r^2 {r2:.2f})."),
                evidence=[f"step {n}: {fmt_bytes(v)} allocated at step end" for n, v in steps[:12]]
                + [f"{fmt_bytes(mem.get('surviving_bytes', 0))} allocated before the last step "
                   "was never freed inside the trace"],
                where=where or ["(no allocation stacks: profile with with_stack=True)"],
                fix=FIX, inputs=[tr.path],
                root_cause=("Something keeps a reference to tensors created each step, so the "
                            "caching allocator can never reuse their memory."),
                metrics={"device": dev, "slope_bytes_per_step": slope, "r2": r2,
                         "steps": len(steps), "first_bytes": first, "last_bytes": last},
            ))
    return out


def _growth(series: list[InputResult], value: Any) -> tuple[list[float], bool]:
    vals = [float(value(s)) for s in series]
    monotonic = all(b >= a for a, b in zip(vals, vals[1:]))
    return vals, monotonic


def _significant(vals: list[float]) -> bool:
    grow = vals[-1] - vals[0]
    return grow >= T.growth_min_bytes and (vals[0] == 0 or 100 * grow / vals[0] >= T.growth_min_pct)


TWO_POINTS = ("Two measurements cannot tell a leak from a cache filling up to its size or from a "
              "step caught at two different moments: a third one later tells (growth must go on).")


def _from_snapshots(ctx: Context) -> list[Finding]:
    """Allocated bytes across snapshots: a leak when it rises at every snapshot, three or more;
    a pair that grew is only worth an info finding (census_growth.py says why)."""
    out = []
    for series in ctx.snapshot_series:
        vals, mono = _growth(series, lambda s: s.data["allocated"])
        if not _significant(vals):
            continue
        few = len(series) < census_growth.MIN_POINTS
        rising = census_growth.growing([int(v) for v in vals])
        if not few and not rising:
            continue  # it went down (or stood still) on the way: freed, not leaked
        first = {x["site"]: x["bytes"] for x in series[0].data["sites"]}
        last = {x["site"]: x["bytes"] for x in series[-1].data["sites"]}
        grew = sorted(((site, b - first.get(site, 0)) for site, b in last.items()), key=lambda x: -x[1])
        where = [f"{site}: +{fmt_bytes(d)}" for site, d in grew[:5] if d > 0]
        pid = series[0].data.get("pid")
        out.append(Finding(
            rule="memory-leak", severity="info" if few else "critical",
            title=(f"Allocated memory grew {fmt_bytes(vals[-1] - vals[0])} between two snapshots: "
                   "a third tells whether it is a leak" if few else
                   f"Allocated memory grew {fmt_bytes(vals[-1] - vals[0])} across {len(series)} snapshots"),
            summary=(f"Process {pid if pid is not None else '?'}: allocated memory went "
                     + " -> ".join(fmt_bytes(v) for v in vals)
                     + (" (up at every snapshot)" if rising and not few else "") + "."),
            evidence=[f"{s.name} ({s.data.get('label') or s.data.get('time_source')}): "
                      f"{fmt_bytes(s.data['allocated'])} allocated, {fmt_bytes(s.data['reserved'])} reserved"
                      for s in series] + ([TWO_POINTS] if few else []),
            where=where or ["(no allocation stacks recorded)"],
            fix=(["Take a third snapshot later (`torch memory -s`) and report the three."] if few else []) + FIX,
            inputs=[s.path for s in series],
            root_cause="Allocations made at the sites above survive from one snapshot to the next.",
            metrics={"allocated": vals, "monotonic": mono, "growth_bytes": vals[-1] - vals[0]},
        ))
    return out


def _from_censuses(ctx: Context) -> list[Finding]:
    """Holders that accumulate across censuses (census_growth.py): up at every census, three
    or more, not capped, not the method's own return value, still holding what they held (a
    running function's local must be seen to outlive its call). Their growth together must be
    significant; a pair of censuses is only worth an info finding."""
    out = []
    for series in ctx.census_series:
        # What the live tensors keep alive: their data plus the autograd graphs hanging off them.
        totals = [s.data["totals"]["bytes"] + (s.data["totals"].get("graph_bytes") or 0) for s in series]
        rows: list[tuple[int, census_growth.History]] = []
        excused: list[tuple[census_growth.History, str]] = []
        for h in census_growth.histories(series):
            kept = h.kept()
            if not census_growth.growing(kept):
                continue
            why = census_growth.why_not_accumulating(h)
            if why is not None:
                excused.append((h, why))
                continue
            rows.append((kept[-1] - kept[0], h))
        grew = sum(d for d, _ in rows)
        if not rows or not _significant([float(totals[0]), float(totals[0] + grew)]):
            continue
        rows.sort(key=lambda r: -r[0])
        few = len(series) < census_growth.MIN_POINTS
        where = [f"{h.path} ({h.last['kind']}, e.g. {h.last.get('example', h.path)}): "
                 f"{h.series('count')[0]} -> {h.last['count']} tensors, +{fmt_bytes(d)} kept alive"
                 for d, h in rows[:5]]
        graph_grew = sum(h.series("graph_bytes")[-1] - h.series("graph_bytes")[0] for _, h in rows)
        fix = FIX
        if grew > 0 and graph_grew >= grew / 2:
            fix = [f"{fmt_bytes(graph_grew)} of the {fmt_bytes(grew)} growth is autograd graph "
                   "kept alive by the held tensors: produce them under `torch.inference_mode()` / "
                   "`torch.no_grad()`, or store `t.detach()` (see graph-retention and graph-chain).", *FIX]
        if few:
            fix = ["Take a third census later (`torch tensors -f c3.json --diff c2.json`) and "
                   "report the three.", *fix]
        evidence = [f"{s.name}: {s.data['totals']['count']} tensors, "
                    f"{fmt_bytes(s.data['totals']['bytes'])}"
                    + (f" + {fmt_bytes(s.data['totals']['graph_bytes'])} of autograd graph"
                       if s.data["totals"].get("graph_bytes") else "") for s in series]
        evidence += [f"not counted: {h.path} grew {fmt_bytes(h.kept()[-1] - h.kept()[0])}, but {why}"
                     for h, why in excused[:5]]
        if few:
            evidence.append(TWO_POINTS)
        out.append(Finding(
            rule="memory-leak", severity="info" if few else "critical",
            title=(f"Live tensors held by {rows[0][1].path} grew {fmt_bytes(grew)} between two censuses: "
                   "a third tells whether it is a leak" if few else
                   f"Live tensor memory grew {fmt_bytes(grew)} across {len(series)} censuses"),
            summary=("Kept alive by holders that grew at every census (their tensors and the graphs "
                     "hanging off them): " + ", ".join(
                         f"{h.path} " + " -> ".join(fmt_bytes(v) for v in h.kept()) for _, h in rows[:3])
                     + "; all live tensors: " + " -> ".join(fmt_bytes(v) for v in totals) + "."),
            evidence=evidence, where=where, fix=fix, inputs=[s.path for s in series],
            root_cause=("The holders above keep more tensors at every census, and still hold the ones "
                        "they held before: nothing gives them back."),
            metrics={"bytes": totals, "growth_bytes": grew,
                     "growing_holders": [h.path for _, h in rows[:10]],
                     "not_counted": {h.path: why for h, why in excused[:10]}},
        ))
    return out


def check(ctx: Context) -> list[Finding]:
    found = _from_traces(ctx) + _from_snapshots(ctx) + _from_censuses(ctx)
    return found + coverage(ctx)


RULE = Rule("memory-leak", "Memory that grows and is never released", check)


def coverage(ctx: Context) -> list[Finding]:
    """What these inputs cannot show about memory, and the command that would show it.

    Info findings, so that a quiet report over partial evidence does not read as an all-clear.
    """
    out: list[Finding] = []
    recordings = [s for s in ctx.snapshots if s.data.get("recorded_calls")]
    moments = [s for s in ctx.snapshots if not s.data.get("recorded_calls")]
    have_census_series = bool(ctx.census_series)
    inputs = [s.path for s in ctx.snapshots] + [c.path for c in ctx.censuses]
    gaps: list[str] = []
    fixes: list[str] = []
    if moments and not have_census_series:
        gaps.append("snapshots alone cannot show small-tensor leaks or who holds the memory "
                    "(many small tensors hide in the allocator's blocks)")
        fixes.append("Run `torch tensors -f census1.json`, let the job run, then "
                     "`torch tensors -f census2.json`, and report both.")
    if len(moments) == 1 and not ctx.snapshot_series:
        gaps.append("one snapshot cannot show growth")
        fixes.append("Take a second snapshot some seconds later (`torch memory -s`) and report both.")
    if recordings and not moments and not ctx.censuses:
        gaps.append(f"{len(recordings)} `-r` recording(s) show the allocations made during a few "
                    "calls, not the process's memory over time")
        fixes.append("For growth over time: `torch memory -s` twice, or `torch tensors` twice.")
    if len(ctx.censuses) == 1 and not have_census_series:
        gaps.append("one census cannot show growth")
        fixes.append("Take a second census later (`torch tensors -f b.json --diff a.json`).")
    if not gaps or not inputs:
        return out
    out.append(Finding(
        rule="coverage", severity="info",
        title="What these inputs cannot show about memory",
        summary="; ".join(gaps).capitalize() + ".",
        evidence=[f"{len(moments)} snapshot(s), {len(recordings)} recording(s), "
                  f"{len(ctx.censuses)} census(es)"],
        fix=fixes, inputs=inputs,
        root_cause="Missing evidence, not a problem found.",
        metrics={"snapshots": len(moments), "recordings": len(recordings),
                 "censuses": len(ctx.censuses)},
    ))
    return out
