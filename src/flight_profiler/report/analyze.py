"""``analyze(paths) -> Report``: read every input, group snapshots/censuses into series per
process, run every registered rule, and order the findings by severity."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from flight_profiler.report.loaders import expand, load_one
from flight_profiler.report.models import SEVERITY_RANK, Finding, InputResult, Report
from flight_profiler.report.rules import Context, all_rules


def _series(items: list[InputResult]) -> list[list[InputResult]]:
    """Group by pid (inputs without one form one group), order by time (then mtime)."""
    groups: dict[Any, list[InputResult]] = {}
    for it in items:
        groups.setdefault(it.data.get("pid"), []).append(it)

    def when(it: InputResult) -> float:
        t = it.data.get("time")
        if isinstance(t, (int, float)):
            return float(t)
        try:
            return os.path.getmtime(it.path)
        except OSError:
            return 0.0

    out = []
    for members in groups.values():
        if len(members) >= 2:
            out.append(sorted(members, key=when))
    return out


def build_context(inputs: list[InputResult]) -> Context:
    ok = [i for i in inputs if i.ok]
    ctx = Context(
        traces=[i for i in ok if i.kind == "trace"],
        snapshots=[i for i in ok if i.kind == "snapshot"],
        censuses=[i for i in ok if i.kind == "census"],
    )
    ctx.snapshot_series = _series(ctx.snapshots)
    ctx.census_series = _series(ctx.censuses)
    return ctx


def _series_data(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for s in ctx.snapshot_series:
        out.append({"kind": "snapshot", "pid": s[0].data.get("pid"),
                    "points": [{"path": x.path, "time": x.data.get("time"), "label": x.data.get("label"),
                                "allocated": x.data["allocated"], "reserved": x.data["reserved"]}
                               for x in s]})
    for s in ctx.census_series:
        out.append({"kind": "census", "pid": s[0].data.get("pid"),
                    "points": [{"path": x.path, "time": x.data.get("time"), "label": x.data.get("label"),
                                "bytes": x.data["totals"]["bytes"], "count": x.data["totals"]["count"],
                                "with_grad_fn": x.data["totals"]["with_grad_fn"],
                                "graph_bytes": x.data["totals"]["graph_bytes"]} for x in s]})
    return out


def analyze(paths: Iterable[str]) -> Report:
    """Diagnose traces, memory snapshots and tensor censuses; never raises for a bad file."""
    inputs = [load_one(p) for p in expand([os.fspath(p) for p in paths])]
    ctx = build_context(inputs)
    findings: list[Finding] = []
    for rule in all_rules():
        findings.extend(rule.check(ctx))
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], f.rule))
    return Report(inputs=inputs, findings=findings, series=_series_data(ctx))
