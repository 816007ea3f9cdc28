"""rich view of a report for the terminal (rich imported only when this runs)."""

from __future__ import annotations

from typing import Any

from flight_profiler.rank_list import ranks_label
from flight_profiler.render.report_summary import hot_rows, memory_rows, ordered_fixes, perf_rows
from flight_profiler.report.models import Report

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def print_report(report: Report, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    problems = [f for f in report.findings if f.severity != "info"]
    t = Table(title="Problem summary", show_lines=False)
    for col in ("severity", "rule", "finding", "where"):
        t.add_column(col, overflow="fold")
    for f in problems:
        who = ranks_label(f.ranks)
        t.add_row(f"[{_STYLE[f.severity]}]{f.severity}[/]", f.rule + (f"\n({who})" if who else ""), f.summary,
                  "\n".join(f.where[:3]))
    if problems:
        con.print(t)
    elif report.readable:
        con.print("[green]No known problem pattern found.[/green]")

    perf = perf_rows(report)
    if perf:
        pt = Table(title="Performance")
        for col in perf[0]:
            pt.add_column(col, overflow="fold")
        for r in perf:
            pt.add_row(*r.values())
        con.print(pt)
    hot = hot_rows(report, limit=8)
    if hot:
        ht = Table(title="Top operators (self time) and kernels")
        for col in ("trace", "kind", "name", "calls", "time"):
            ht.add_column(col, overflow="fold")
        for h in hot:
            ht.add_row(h["trace"], h["kind"], h["name"][:90], str(h["calls"]), h["time"])
        con.print(ht)
    mem = memory_rows(report)
    if mem:
        mt = Table(title="Memory")
        for col in ("source", "device", "total", "allocated", "reserved", "peak"):
            mt.add_column(col, overflow="fold")
        for r in mem:
            mt.add_row(*(r[c] for c in ("source", "device", "total", "allocated", "reserved", "peak")))
        con.print(mt)
    fixes = ordered_fixes(report)
    if fixes:
        con.print("[bold]Recommendations[/bold]")
        for n, (rule, fix) in enumerate(fixes[:12], 1):
            con.print(f"  {n}. {fix} [dim]({rule})[/dim]", highlight=False)
