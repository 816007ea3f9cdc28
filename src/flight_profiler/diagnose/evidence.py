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
    "census-middle": "whether growth goes on (three censuses tell a leak from a cache filling up)",
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


def live_findings(result: DiagnoseResult) -> list[Finding]:
    """Findings from the watch and input phases (not from files): input-bound loops."""
    from flight_profiler.report.rules import dataloader_bottleneck

    phase = result.phase("input")
    watch = result.phase("watch")
    loop = (watch.data.get("loop") if watch is not None else None) or None
    if phase is None or loop is None or result.options.target is None:
        return []
    status = result.phase("status")
    cuda = bool(status.data.get("cuda")) if status is not None else False
    inputs = [os.path.join(result.options.out_dir, "diagnose.json")]
    finding = dataloader_bottleneck.from_live(
        loop, phase.data.get("threads") or [], phase.data.get("loaders") or [],
        result.options.target.label, cpus=phase.data.get("cpus"), cuda=cuda, inputs=inputs)
    return [finding] if finding is not None else []


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


def merge(result: DiagnoseResult, findings: list[Finding]) -> list[Finding]:
    """The engine's findings plus the live ones; a live input-bound verdict replaces a weaker
    trace-based one of the same rule (one problem, one finding)."""
    refine_fixes(result, findings)
    extra = live_findings(result)
    rules = {f.rule for f in extra}
    merged = [f for f in findings if f.rule not in rules] + extra
    merged.sort(key=Finding.order)
    return merged


def as_dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [dict(i) for i in items]
