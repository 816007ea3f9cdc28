"""What the diagnosis adds to the report engine's verdicts: findings from live evidence that no
artefact file carries (the method's share of its loop, the DataLoaders' real settings), and the
evidence that is missing because a phase failed, with what that hides.
"""

from __future__ import annotations

import os
from typing import Any

from flight_profiler.diagnose.model import FAILED, TIMED_OUT, DiagnoseResult
from flight_profiler.report.models import Finding

# What each phase's evidence shows; when it fails, what the report cannot see.
HIDES = {
    "status": "whether torch and CUDA are there (every torch phase)",
    "locate": "every phase that observes the method's calls",
    "memory": "the allocator's state (allocated vs reserved, fragmentation)",
    "snapshot-before": "memory growth over time and fragmentation (snapshots)",
    "snapshot-after": "memory growth over time and fragmentation (snapshots)",
    "census-before": "leaks of small tensors, who holds them, and retained autograd graphs",
    "census-after": "leaks of small tensors, who holds them, and retained autograd graphs",
    "profile": "hot operators, launch overhead, transfer/sync stalls, DataLoader waits in the step",
    "record": "where the method allocates",
    "watch": "the method's cost per call and its share of the loop (input-bound loops)",
    "input": "the DataLoaders' settings and what the loop waits on between calls",
    "trace": "where the time goes inside the method",
}


def missing(result: DiagnoseResult) -> list[dict[str, str]]:
    """Phases that failed or timed out, each with why and what it hides."""
    return [{"phase": p.name, "title": p.title, "status": p.status, "reason": p.reason,
             "hides": HIDES.get(p.name, "its evidence")}
            for p in result.phases if p.status in (FAILED, TIMED_OUT)]


def step_of(findings_inputs: list[Any]) -> dict[str, Any] | None:
    """The step model of the profile (the first trace's), as the report computed it."""
    for inp in findings_inputs:
        if getattr(inp, "kind", None) == "trace" and inp.ok and inp.data.get("step"):
            return dict(inp.data["step"])
    return None


def dataloader_share(result: DiagnoseResult, inputs: list[Any]) -> dict[str, Any] | None:
    """The DataLoader's share of the loop, timed (input phase) and in the profile's steps."""
    from flight_profiler.report.live_loop import dataloader_share as timed_share

    out: dict[str, Any] = {}
    phase = result.phase("input")
    watch = result.phase("watch")
    if phase is not None:
        timed = timed_share(phase.data.get("next_timing") or [],
                            (watch.data.get("loop") if watch is not None else None) or None)
        if timed is not None:
            out["timed_pct"] = round(100.0 * float(timed["share"]), 2)
            out["timed"] = timed
    for inp in inputs:
        dl = inp.data.get("dataloader") if getattr(inp, "kind", None) == "trace" and inp.ok else None
        if dl:
            out["profile_pct"] = dl.get("pct_of_window")
            out["profile"] = {k: dl.get(k) for k in ("calls", "total_us", "clipped", "left_out",
                                                      "cut_us")}
            out["profile"]["over"] = inp.data.get("window_kind")
            break
    return out or None


def live_findings(result: DiagnoseResult, step: dict[str, Any] | None = None) -> list[Finding]:
    """Findings from the watch and input phases (not from files): the DataLoader's share of the
    loop (timed), and a loop that idles."""
    from flight_profiler.report import live_loop

    phase = result.phase("input")
    if phase is None:
        return []
    watch = result.phase("watch")
    loop = (watch.data.get("loop") if watch is not None else None) or None
    status = result.phase("status")
    cuda = bool(status.data.get("cuda")) if status is not None else False
    inputs = [os.path.join(result.options.out_dir, "diagnose.json")]
    method = result.options.target.label if result.options.target is not None else None
    threads = phase.data.get("threads") or []
    timed = live_loop.dataloader_share(phase.data.get("next_timing") or [], loop)
    out = []
    loader = live_loop.dataloader_finding(timed, loop, threads, phase.data.get("loaders") or [],
                                          method, step, phase.data.get("cpus"), cuda, inputs)
    if loader is not None:
        out.append(loader)
    idle = live_loop.idle_finding(loop, threads, method, inputs)
    if idle is not None:
        out.append(idle)
    return out


def refine_fixes(result: DiagnoseResult, findings: list[Finding]) -> None:
    """A trace-based DataLoader finding gets the fix that starts from the loader's settings."""
    from flight_profiler.report.rules import dataloader_bottleneck

    phase = result.phase("input")
    loaders = (phase.data.get("loaders") if phase is not None else None) or []
    loader = next((d for d in loaders if d.get("iterators")), loaders[0] if loaders else None)
    if loader is None:
        return
    status = result.phase("status")
    cuda = bool(status.data.get("cuda")) if status is not None else False
    for f in findings:
        if f.rule == "dataloader-bottleneck" and not f.metrics.get("busy_share"):
            f.fix = dataloader_bottleneck.settings_fix(loader, cpus=phase.data.get("cpus") if phase else None,
                                                       cuda=cuda) + f.fix[2:]


def merge(result: DiagnoseResult, findings: list[Finding], inputs: list[Any] | None = None,
          ) -> list[Finding]:
    """The engine's findings plus the live ones. One problem, one finding: a live DataLoader
    verdict replaces the trace-based one, and a DataLoader share timed without the profiler
    decides (the profiler slows the loop, not the workers); the trace's figures stay as
    evidence."""
    from flight_profiler.report.cost import settle

    step = step_of(inputs or [])
    refine_fixes(result, findings)
    extra = live_findings(result, step)
    settle(extra)
    phase = result.phase("input")
    timed = None
    if phase is not None:
        from flight_profiler.report.live_loop import dataloader_share

        watch = result.phase("watch")
        timed = dataloader_share(phase.data.get("next_timing") or [],
                                 (watch.data.get("loop") if watch is not None else None) or None)
    rules = {f.rule for f in extra}
    if timed is not None:
        rules.add("dataloader-bottleneck")  # the timed share is the verdict, either way
    replaced = [f for f in findings if f.rule in rules]
    for f in extra:
        for old in replaced:
            if old.rule == f.rule:
                f.evidence += [f"in the profile: {line}" for line in old.evidence[:2]]
                f.where = f.where or old.where
    merged = [f for f in findings if f.rule not in rules] + extra
    merged.sort(key=Finding.order)
    return merged


def as_dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [dict(i) for i in items]
