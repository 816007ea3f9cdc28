"""`trace module [class] method`: the call tree below each matching call, with inclusive times."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.watch import (
    Spinner,
    stamp,
    summary,
)
from flight_profiler.report.units import fmt_ms

if TYPE_CHECKING:
    from rich.console import Console


def short_path(path: str) -> str:
    """``.../site-packages/torch/nn/modules/linear.py`` -> ``torch/nn/modules/linear.py``."""
    if not path:
        return ""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    except ValueError:
        pass
    return path


def tree_lines(node: dict[str, Any], prefix: str = "") -> list[str]:
    """The children of ``node`` as box-drawing lines (rich markup escaped)."""
    from rich.markup import escape

    lines: list[str] = []
    children = list(node.get("children") or [])
    hidden: dict[str, Any] = node.get("hidden") or {}
    entries: list[dict[str, Any]] = children + ([hidden] if hidden else [])
    for i, child in enumerate(entries):
        last = i == len(entries) - 1
        branch = "└─ " if last else "├─ "
        if child is hidden:
            why = "deeper" if child.get("deeper") else "faster"
            lines.append(f"{prefix}{branch}[dim]… {child['count']:,} {why} call(s) hidden "
                         f"({fmt_ms(child['ms'])} total)[/dim]")
            continue
        count = f" ×{child['count']:,}" if child.get("count", 1) > 1 else ""
        where = f"{short_path(child.get('file', ''))}:{child['line']}" if child.get("file") else ""
        name = escape(child.get("name", "?"))
        if name.startswith("builtin "):
            name = f"[magenta]{name}[/magenta]"
        lines.append(f"{prefix}{branch}[bold]{fmt_ms(child['ms'])}[/bold] {name}{count}"
                     + (f"  [dim]{escape(where)}[/dim]" if where else ""))
        lines += tree_lines(child, prefix + ("   " if last else "│  "))
    return lines


def make_renderers(spinner: Spinner) -> tuple[Any, Any]:
    from rich.markup import escape

    def render_event(data: dict[str, Any], console: Console) -> None:
        kind = data.get("type")
        if kind == "tracing":
            extra = [f"hiding subtrees under {data.get('min_ms', 0.1):g} ms"]
            if data.get("depth"):
                extra.append(f"depth {data['depth']}")
            if data.get("count"):
                extra.append(f"up to {data['count']} call(s)")
            if data.get("filter"):
                extra.append(f"where {data['filter']}")
            if data.get("c_calls"):
                extra.append("with C calls")
            console.print(f"tracing [bold]{escape(data.get('target', '?'))}[/bold] "
                          f"({escape(', '.join(extra))}) · Ctrl-C to stop", highlight=False, soft_wrap=True)
            spinner.start(console, "waiting for a call")
            return
        spinner.pause()
        if kind == "trace":
            tree = data.get("tree", {})
            where = f"{short_path(tree.get('file', ''))}:{tree.get('line')}"
            head = (f"[dim]{stamp(data.get('ts'))}[/dim] #{data.get('n')} {escape(str(data.get('thread')))}  "
                    f"[bold]{fmt_ms(data.get('cost_ms', 0))}[/bold] {escape(tree.get('name', '?'))}"
                    f"{escape(data.get('params', ''))}  [dim]{escape(where)}[/dim]")
            if data.get("exception"):
                head += f"  [red]raised {escape(data['exception'])}[/red]"
            console.print(head, highlight=False, soft_wrap=True)
            for line in tree_lines(tree):
                console.print(line, highlight=False, soft_wrap=True)
        elif kind == "filter_error":
            console.print(f"[yellow]filter raised {escape(str(data.get('message')))}; such calls "
                          f"count as not matching[/yellow]", highlight=False)
        spinner.resume()

    def render_result(data: dict[str, Any], console: Console) -> None:
        spinner.stop()
        console.print(summary(data, "trace"), highlight=False, soft_wrap=True)

    return render_event, render_result
