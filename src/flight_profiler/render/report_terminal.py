"""rich view of a report for the terminal, readable at 80 columns (rich imported only when this runs).

Order: the verdict (the costliest problem, in one line), the findings worst first each with
what it costs, then one block per trace (its file named once, as the block's heading), memory,
the fixes in order, and the inputs. Kernel and operator names are shortened to fit; artefact
paths are printed whole on lines of their own, never wrapped, so that they can be copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flight_profiler.rank_list import ranks_label
from flight_profiler.render.report_summary import (
    fit_line,
    memory_rows,
    ordered_fixes,
    short_name,
    trace_label,
)
from flight_profiler.render.safe_report import safe_copy
from flight_profiler.report.models import Finding, InputResult, Report
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_pct, fmt_us
from flight_profiler.safe_text import safe_text

if TYPE_CHECKING:
    from rich.console import Console

# The one terminal style per severity (report, diagnose and job summaries alike).
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
INDENT = 4


def _cost_text(f: Finding) -> str:
    if f.cost is None:
        return ""
    return f"costs {fmt_pct(f.cost.pct)} of {f.cost.of}"


def verdict(report: Report) -> str:
    """One line: the problem to fix first, or that there is none (its names made safe)."""
    return safe_text(_verdict(report))


def _verdict(report: Report) -> str:
    problems = [f for f in report.findings if f.severity != "info"]
    if not problems:
        if not report.readable:
            return "Nothing could be read."
        return "Verdict: no known problem pattern costs measurable time."
    f = problems[0]
    cost = ""
    if f.cost is not None and fmt_pct(f.cost.pct) not in f.title:
        cost = f" ({_cost_text(f)})"
    where = _finding_source(report, f)
    return f"Verdict, fix first: {f.title}{cost}" + (f" in {where}" if where else "")


def _finding_source(report: Report, f: Finding) -> str:
    by_path = {i.path: i for i in report.inputs}
    names = [trace_label(by_path[p]) if p in by_path else p for p in f.inputs[:2]]
    more = f" +{len(f.inputs) - 2}" if len(f.inputs) > 2 else ""
    return ", ".join(names) + more


def print_report(report: Report, console: Console | None = None) -> None:
    from rich.console import Console
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    report = safe_copy(report)  # every name from the inputs shown escaped, never run
    con = console or Console()
    width = max(60, min(con.width, 120))
    inner = width - INDENT

    con.print(Text(verdict(report), style="bold"))
    con.print()

    problems = [f for f in report.findings if f.severity != "info"]
    if problems:
        con.print(Text("Findings, costliest first", style="bold underline"))
    for f in problems:
        line = Text()
        line.append(f"{f.severity.upper()} ", style=SEVERITY_STYLE[f.severity])
        line.append(f.rule, style="bold")
        if f.ranks is not None:
            line.append(f" ({ranks_label(f.ranks)})")
        if f.cost is not None:
            line.append(f" · {fmt_pct(f.cost.pct)} of {f.cost.of}")
        src = _finding_source(report, f)
        if src:
            line.append(f" · {src}", style="dim")
        con.print(line)
        con.print(Padding(Text(f.title), (0, 0, 0, INDENT)))
        con.print(Padding(Text(_strip_source(f.summary, report, f), style="dim"),
                          (0, 0, 0, INDENT)))
        for w in f.where[:2]:
            con.print(Padding(Text("at " + fit_line(w, inner - 3)), (0, 0, 0, INDENT)),
                      no_wrap=True, overflow="ellipsis")
        if f.cost is not None:
            con.print(Padding(Text(f"cost estimated as {f.cost.method}", style="dim italic"),
                              (0, 0, 0, INDENT)))
    infos = [f for f in report.findings if f.severity == "info"]
    if infos:
        con.print(Text("Also noted (info: costs under "
                       f"{fmt_pct(T.cost_warning_pct)} or no cost to measure)", style="bold"))
        for f in infos:
            cost = f" · {fmt_pct(f.cost.pct)} of {f.cost.of}" if f.cost is not None else ""
            src = _finding_source(report, f)
            con.print(Padding(Text(f"{f.rule}{cost}" + (f" · {src}" if src else "")),
                              (0, 0, 0, 2)))
            if f.rule != "hot-operators":
                con.print(Padding(Text(f.title, style="dim"), (0, 0, 0, INDENT)))
    con.print()

    for inp in report.readable:
        if inp.kind == "trace":
            _trace_block(con, inp, inner)

    mem = memory_rows(report)
    if mem:
        mt = Table(title="Memory", title_justify="left", box=None, pad_edge=False)
        for col in ("source", "device", "allocated", "reserved", "peak"):
            mt.add_column(col, overflow="ellipsis", no_wrap=col != "allocated",
                          max_width=28 if col == "source" else None)
        for r in mem:
            # Text, not markup: a file named "[/x]" is a name, not a style tag
            mt.add_row(*(Text(r[c]) for c in ("source", "device", "allocated", "reserved", "peak")))
        con.print(mt)
        con.print()

    fixes = ordered_fixes(report)
    if fixes:
        con.print(Text("What to do, in order", style="bold underline"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", no_wrap=True)
        grid.add_column(ratio=1)
        for n, (rule, fix) in enumerate(fixes[:10], 1):
            t = Text(fix)
            t.append(f" ({rule})", style="dim")
            grid.add_row(f"{n}.", t)
        con.print(Padding(grid, (0, 0, 0, 1)))
        con.print()

    con.print(Text("Inputs", style="bold underline"))
    for inp in report.inputs:
        state = "read" if inp.ok else f"NOT READ: {inp.error}"
        con.print(Text(f"  {inp.kind}, {state}, {inp.elapsed_s:.2f} s", style="dim"))
        # Whole, on its own line, never wrapped: users copy these paths.
        con.print(Text(f"    {inp.path}"), soft_wrap=True)


def _strip_source(summary: str, report: Report, f: Finding) -> str:
    """Findings start with 'file (rank N): '; the view names the file once, above."""
    for p in f.inputs:
        for inp in report.inputs:
            if inp.path == p:
                for prefix in (trace_label(inp) + ": ", inp.name + ": "):
                    if summary.startswith(prefix):
                        return summary[len(prefix):]
    return summary


def _trace_block(con: Console, inp: InputResult, inner: int) -> None:
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    m = inp.data
    con.print(Text(trace_label(inp), style="bold underline"))
    s = m.get("steps", {})
    facts = [f"{m.get('events')} events"]
    if s.get("count"):
        facts.append(f"{s['count']} steps of {fmt_us(s['mean_us'])} mean (cv {s['cv']:.2f})")
    else:
        facts.append(f"window {fmt_us(m.get('window_us'))}")
    b = m.get("gpu_time_breakdown")
    lines = [", ".join(facts)]
    if b:
        lines.append(f"GPU idle {fmt_pct(b['idle_pct'])}, compute {fmt_pct(b['compute_pct'])}, "
                     f"other {fmt_pct(b['non_compute_pct'])} of {fmt_us(b['span_us'])}")
    else:
        lines.append("no GPU events (CPU-only trace)")
    c = m.get("communication")
    if c:
        lines.append(f"communication {fmt_pct(c['pct_of_kernel_time'])} of kernel time, "
                     f"exposed {fmt_us(c['exposed_us'])} ({fmt_pct(c['exposed_pct_of_span'])})")
    extra = []
    if m.get("sync"):
        extra.append(f"CPU blocked in syncs {fmt_pct(m['sync']['pct_of_window'])}")
    if m.get("dataloader"):
        extra.append(f"DataLoader {fmt_pct(m['dataloader']['pct_of_window'])}")
    if m.get("memcpy"):
        extra.append(f"H<->D copies {fmt_pct(m['memcpy']['host_device_pct_of_gpu_busy'])} of GPU busy")
    if extra:
        lines.append(", ".join(extra))
    for ln in lines:
        con.print(Padding(Text(ln), (0, 0, 0, INDENT)))

    rows: list[tuple[str, str, str, str]] = []
    for o in m.get("top_operators", [])[:5]:
        rows.append(("op", o["name"], str(o["calls"]), fmt_us(o["self_us"]) + " self"))
    for k in m.get("top_kernels", [])[:5]:
        rows.append(("kernel", k["name"], str(k["calls"]), fmt_us(k["total_us"])))
    if rows:
        name_w = max(20, inner - 34)
        t = Table(box=None, pad_edge=False, show_header=True, header_style="dim")
        t.add_column("", no_wrap=True)
        t.add_column("top by time", no_wrap=True, overflow="ellipsis", max_width=name_w)
        t.add_column("calls", justify="right", no_wrap=True)
        t.add_column("time", justify="right", no_wrap=True)
        for kind, name, calls, time in rows:
            t.add_row(kind, Text(short_name(name, name_w)), calls, time)
        con.print(Padding(t, (0, 0, 0, INDENT)))
    con.print()
