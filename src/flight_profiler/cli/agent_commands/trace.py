"""`trace module [class] method`: the call tree below each matching call, with inclusive times."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.base import fmt, txt
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


def tree_lines(root: dict[str, Any], prefix: str = "") -> list[str]:
    """The children of ``root`` as box-drawing lines (text from the target made safe and
    escaped). Walked with an explicit stack: a tree as deep as the agent may send does not
    recurse here."""
    lines: list[str] = []
    # (node, its prefix, last of its siblings, the "hidden" summary rather than a call)
    stack: list[tuple[dict[str, Any], str, bool, bool]] = []

    def push_children(node: dict[str, Any], pre: str) -> None:
        entries = [(child, False) for child in node.get("children") or []]
        if node.get("hidden"):
            entries.append((node["hidden"], True))
        for i in reversed(range(len(entries))):  # pushed in reverse: popped in order
            stack.append((entries[i][0], pre, i == len(entries) - 1, entries[i][1]))

    push_children(root, prefix)
    while stack:
        child, pre, last, hidden = stack.pop()
        branch = "└─ " if last else "├─ "
        if hidden:
            why = "deeper" if child.get("deeper") else "faster"
            lines.append(f"{pre}{branch}[dim]… {fmt(child.get('count'), ',')} {why} call(s) hidden "
                         f"({fmt_ms(child.get('ms') or 0)} total)[/dim]")
            continue
        count = child.get("count") or 1
        times = f" ×{fmt(count, ',')}" if count > 1 else ""
        where = f"{short_path(child.get('file') or '')}:{fmt(child.get('line'), 'd')}" if child.get("file") else ""
        name = txt(child.get("name") or "?", 400)
        if name.startswith("builtin "):
            name = f"[magenta]{name}[/magenta]"
        summed = (f"  [yellow]calls below summed over its {fmt(child['summed_over_callers'], 'd')} "
                  f"callers[/yellow]" if child.get("summed_over_callers") else "")
        lines.append(f"{pre}{branch}[bold]{fmt_ms(child.get('ms') or 0)}[/bold] {name}{times}"
                     + (f"  [dim]{txt(where)}[/dim]" if where else "") + summed)
        push_children(child, pre + ("   " if last else "│  "))
    return lines


def make_renderers(spinner: Spinner) -> tuple[Any, Any]:
    def render_event(data: dict[str, Any], console: Console) -> None:
        kind = data.get("type")
        if kind == "tracing":
            extra = [f"hiding subtrees under {fmt(data.get('min_ms', 0.1), 'g')} ms"]
            if data.get("depth"):
                extra.append(f"depth {fmt(data['depth'], 'd')}")
            if data.get("count"):
                extra.append(f"up to {fmt(data['count'], 'd')} call(s)")
            if data.get("filter"):
                extra.append(f"where {txt(data['filter'])}")
            if data.get("c_calls"):
                extra.append("with C calls")
            console.print(f"tracing [bold]{txt(data.get('target', '?'))}[/bold] "
                          f"({', '.join(extra)}) · Ctrl-C to stop", highlight=False, soft_wrap=True)
            spinner.start(console, "waiting for a call")
            return
        spinner.pause()
        if kind == "trace":
            tree = data.get("tree") or {}
            where = f"{short_path(tree.get('file') or '')}:{fmt(tree.get('line'), 'd')}"
            head = (f"[dim]{stamp(data.get('ts'))}[/dim] #{fmt(data.get('n'), 'd')} {txt(data.get('thread'), 200)}  "
                    f"[bold]{fmt_ms(data.get('cost_ms') or 0)}[/bold] {txt(tree.get('name') or '?', 400)}"
                    f"{txt(data.get('params') or '')}  [dim]{txt(where)}[/dim]")
            if data.get("exception"):
                head += f"  [red]raised {txt(data['exception'])}[/red]"
            if tree.get("summed_over_callers"):
                head += "  [yellow]recursed: calls below summed over its recursive calls[/yellow]"
            console.print(head, highlight=False, soft_wrap=True)
            for line in tree_lines(tree):
                console.print(line, highlight=False, soft_wrap=True)
        elif kind == "filter_error":
            console.print(f"[yellow]filter raised {txt(data.get('message'))}; such calls "
                          f"count as not matching[/yellow]", highlight=False)
        spinner.resume()

    def render_result(data: dict[str, Any], console: Console) -> None:
        spinner.stop()
        console.print(summary(data, "trace"), highlight=False, soft_wrap=True)

    return render_event, render_result
