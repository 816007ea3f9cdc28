"""Markdown view of a report, in the diagnosis-report structure: Problem Summary, GPU Memory
State, Performance Analysis, Evidence Chain, Root Cause, Recommendations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flight_profiler.rank_list import ranks_label
from flight_profiler.render.report_summary import (
    hot_rows,
    memory_columns,
    memory_heading,
    memory_rows,
    ordered_fixes,
    perf_rows,
    quiet_text,
)
from flight_profiler.render.safe_report import safe_copy
from flight_profiler.report.models import Report

_ICON = {"critical": "CRITICAL", "warning": "WARNING", "info": "info"}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(rows: Sequence[Mapping[str, object]], cols: list[str]) -> list[str]:
    if not rows:
        return []
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return [*out, ""]


def render_markdown(report: Report) -> str:
    report = safe_copy(report)  # every name from the inputs shown escaped (`cat report.md`)
    L: list[str] = ["# flight_profiler report", ""]
    L.append("Inputs:")
    for inp in report.inputs:
        if inp.ok:
            extra = f", rank {inp.rank}" if inp.rank is not None else ""
            L.append(f"- `{inp.path}`: {inp.kind}{extra}")
        else:
            L.append(f"- `{inp.path}`: **not read**: {inp.error}")
    L.append("")

    L += ["## Problem Summary", ""]
    problems = [f for f in report.findings if f.severity != "info"]
    if not report.readable:
        L += ["No input could be read.", ""]
    elif not problems:
        L += [quiet_text(report), ""]
    else:
        L += _table([{"severity": _ICON[f.severity], "rule": f"`{f.rule}`", "finding": f.title,
                      "cost": f"{f.cost.pct:.1f}% of {f.cost.of}" if f.cost is not None else "-",
                      "input": ", ".join(p.rsplit("/", 1)[-1] for p in f.inputs[:3])}
                     for f in problems], ["severity", "rule", "finding", "cost", "input"])

    L += [f"## {memory_heading(report)}", ""]
    mem = memory_rows(report)
    L += _table(mem, memory_columns(mem)) if mem else [
        "No memory data in these inputs (profile with profile_memory=True, or take a snapshot).", ""]

    L += ["## Performance Analysis", ""]
    perf = perf_rows(report)
    if perf:
        L += _table(perf, list(perf[0].keys()))
        hot = hot_rows(report)
        if hot:
            L += ["Key operations (top by self time; kernels by total time):", ""]
            L += _table([{**h, "name": f"`{h['name'][:100]}`"} for h in hot],
                        ["trace", "kind", "name", "calls", "time"])
    else:
        L += ["No trace among the inputs.", ""]

    L += ["## Evidence Chain", ""]
    if not report.findings:
        L += ["Nothing to show.", ""]
    for f in report.findings:
        who = ranks_label(f.ranks)
        L.append(f"### [{_ICON[f.severity]}] `{f.rule}`{f' ({who})' if who else ''}: {f.title}")
        L += ["", f.summary, ""]
        if f.cost is not None:
            L += [f"Cost: {f.cost.pct:.1f}% of {f.cost.of} ({f.cost.us / 1000:.2f} ms), "
                  f"estimated as {f.cost.method}.", ""]
        L += [f"- {e}" for e in f.evidence]
        if f.where:
            L += ["", "Where:", ""] + [f"- `{w}`" for w in f.where]
        L.append("")

    L += ["## Root Cause", ""]
    causes = [f for f in problems if f.root_cause]
    if not causes:
        L += ["No problem pattern, so no root cause to name.", ""]
    for f in causes:
        L.append(f"- **{f.rule}** ({f.inputs[0].rsplit('/', 1)[-1] if f.inputs else ''}): {f.root_cause}")
    L.append("")

    L += ["## Recommendations", ""]
    fixes = ordered_fixes(report)
    if not fixes:
        L += ["Nothing to fix.", ""]
    for n, (rule, fix) in enumerate(fixes, 1):
        L.append(f"{n}. {fix} _({rule})_")
    L.append("")
    return "\n".join(L)
