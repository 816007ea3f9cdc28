"""Views of a ``report --diff`` (report/diff.py): terminal tables and Markdown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flight_profiler.render.safe_report import safe_copy
from flight_profiler.report.diff import Change, Diff, fmt_value

if TYPE_CHECKING:
    from rich.console import Console

NAME_WIDTH = 90


def _name(text: str) -> str:
    return text if len(text) <= NAME_WIDTH else text[: NAME_WIDTH - 3] + "..."


def _delta(c: Change) -> str:
    if c.before and not c.after:
        return "gone"
    if not c.before and c.after:
        return "new"
    d = c.delta_pct
    return "-" if d is None else f"{d:+.1f}%"


def print_diff(diff: Diff, console: Console | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Column, Table

    diff = safe_copy(diff)
    console = console or Console()
    console.print(f"[bold]{escape(diff.verdict)}[/bold]")
    console.print(f"before: {escape(diff.before)}\nafter:  {escape(diff.after)}", highlight=False)
    for title, rows in diff.sections.items():
        if not rows:
            continue
        t = Table(Column(title, overflow="fold"), "before", "after", "change")
        for c in rows:
            t.add_row(escape(_name(c.what)), fmt_value(c.before, c.unit), fmt_value(c.after, c.unit),
                      _delta(c))
        console.print(t)
    for note in diff.notes:
        console.print(f"[dim]{escape(note)}[/dim]", highlight=False)


def diff_markdown(diff: Diff) -> str:
    diff = safe_copy(diff)
    lines = [f"# {diff.verdict}", "", f"- before: `{diff.before}`", f"- after: `{diff.after}`", ""]
    for title, rows in diff.sections.items():
        if not rows:
            continue
        lines += [f"## {title}", "", "| | before | after | change |", "|---|---|---|---|"]
        lines += [f"| `{_name(c.what)}` | {fmt_value(c.before, c.unit)} | {fmt_value(c.after, c.unit)} | {_delta(c)} |"
                  for c in rows]
        lines.append("")
    lines += [f"> {n}" for n in diff.notes]
    return "\n".join(lines) + "\n"
