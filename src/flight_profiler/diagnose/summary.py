"""The terminal summary of a diagnosis (rich) and its --json form; no analysis here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.diagnose.model import OK, DiagnoseResult
from flight_profiler.render.report_terminal import SEVERITY_STYLE
from flight_profiler.report.models import SEVERITY_RANK, Finding

if TYPE_CHECKING:
    from rich.console import Console



def ranked_findings(result: DiagnoseResult) -> list[Finding]:
    """Findings worst first (stable: the engine's own order within a severity)."""
    findings = list(result.report.findings) if result.report is not None else []
    return sorted(findings, key=lambda f: -SEVERITY_RANK[f.severity])


def to_json(result: DiagnoseResult, exit_code: int) -> dict[str, Any]:
    data = result.to_dict()
    data["findings"] = [f.to_dict() for f in ranked_findings(result)]
    data["exit_code"] = exit_code
    return data


def render(result: DiagnoseResult, console: Console, top: int = 5) -> None:
    from flight_profiler.safe_text import safe_markup as escape  # text from the target or files

    o = result.options
    target = o.target.words if o.target else "a time window"
    console.print(f"[bold]flight_profiler diagnose[/bold] pid {o.pid}, {escape(target)} "
                  f"({result.finished - result.started:.1f}s)", highlight=False)
    if result.step:
        from flight_profiler.diagnose.outputs import step_line

        console.print(f"  [dim]{escape(step_line(result.step))}[/dim]", highlight=False)
    not_ok = [p for p in result.phases if p.status != OK]
    no_cuda = [p for p in not_ok if p.reason.startswith("no CUDA")]
    if no_cuda:
        console.print(f"  [dim]skipped, no CUDA in the target: "
                      f"{escape(', '.join(p.title for p in no_cuda))}[/dim]", highlight=False)
    for p in not_ok:
        if p in no_cuda:
            continue
        console.print(f"  [dim]{escape(p.title)}: {p.status.replace('_', ' ')}: "
                      f"{escape(p.reason)}[/dim]", highlight=False)
    findings = ranked_findings(result)
    if result.report is None:
        console.print("[red]no report[/red] (see the phases above)")
    elif not findings and any(p.status in ("failed", "timed_out") for p in result.phases):
        from flight_profiler.diagnose.evidence import missing

        console.print("[yellow]No problem found in the evidence collected, but it is "
                      "incomplete:[/yellow]")
        for gap in missing(result):
            console.print(f"  - without {escape(gap['title'].lower())}: cannot see "
                          f"{escape(gap['hides'])}", highlight=False)
    elif not findings:
        console.print("[green]No problem found.[/green]")
    else:
        console.print(f"\n[bold]{len(findings)} finding(s)[/bold], worst first:")
        for f in findings[:top]:
            style = SEVERITY_STYLE[f.severity]
            console.print(f"\n[{style}]{f.severity.upper()}[/{style}] [bold]{escape(f.title)}[/bold] "
                          f"[dim]({escape(f.rule)})[/dim]", highlight=False)
            if f.summary:
                console.print(f"  {escape(f.summary)}", highlight=False)
            for line in f.evidence[:3]:
                console.print(f"  - {escape(line)}", highlight=False)
            for line in f.where[:2]:
                console.print(f"  [dim]where:[/dim] {escape(line)}", highlight=False)
            if f.fix:
                console.print(f"  [green]fix:[/green] {escape(f.fix[0])}", highlight=False)
        if len(findings) > top:
            console.print(f"\n... and {len(findings) - top} more in the report")
    watch = result.phase("watch")
    cost = (watch.data.get("cost") if watch is not None else None) or {}
    if cost.get("calls"):
        console.print(f"\ncost of {escape(o.target.label if o.target else '?')}: median "
                      f"{cost['median_ms']:.3f} ms, p90 {cost['p90_ms']:.3f} ms over "
                      f"{cost['calls']} calls ({escape(cost['verdict'])})", highlight=False)
    trace = result.phase("trace")
    where = (trace.data.get("where_time_goes") if trace is not None else None) or {}
    if where.get("top"):
        console.print(f"where the time goes in {escape(o.target.label if o.target else '?')} "
                      f"(over {where['calls']} traced calls):", highlight=False)
        for row in where["top"][:5]:
            indent = "  " * row["depth"]
            console.print(f"{indent}{row['share_pct']:5.1f}%  {escape(str(row['name']))}",
                          highlight=False)
    # Paths are never wrapped: a user copies them (soft_wrap leaves long lines to the terminal).
    console.print("\nreport and artefacts:", highlight=False)
    console.print(f"  {escape(o.out_dir)}", highlight=False, soft_wrap=True)
    for fmt in ("md", "html", "json"):
        if fmt in result.outputs:
            console.print(f"  {escape(result.outputs[fmt])}", highlight=False, soft_wrap=True)
