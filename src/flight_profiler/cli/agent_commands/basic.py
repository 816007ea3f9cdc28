"""`status`, `stack`, `detach`: the commands every session starts with."""

from __future__ import annotations

from flight_profiler.cli.agent_commands.base import fmt, txt

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from typing import Any, Callable

    from rich.console import Console


def status_rows(data: dict[str, Any], text: Callable[..., str],
                number: Callable[[object, str], str]) -> list[tuple[str, str]]:
    """The status table's rows: ``text(value[, limit])`` and ``number(value, spec)`` make a
    value printable (txt and fmt for rich; cli/plain_status.py gives plain-text ones)."""
    py = data.get("python") or {}
    torch = data.get("torch") or {}
    rows = [
        ("agent", f"{text(data.get('agent_version'), 80)} (up {number(data.get('uptime_s'), '.1f')}s)"),
        ("pid", number(data.get("pid"), "d")),
        ("python", f"{text(py.get('version'), 80)} {text(py.get('executable'))}"),
        ("argv", text(" ".join(py.get("argv") or []))),
    ]
    threads = data.get("threads") or {}
    rows.append(("threads", f"{number(threads.get('total'), 'd')} ({number(threads.get('agent'), 'd')} of "
                            "them the agent's)"))
    if torch.get("imported"):
        cuda = torch.get("cuda_available")
        cuda_text = ("CUDA available" if cuda is True else "CUDA not available" if cuda is False
                     else "CUDA unknown")
        if torch.get("cuda_error"):
            cuda_text += f" ({text(torch['cuda_error'], 400)})"
        rows.append(("torch", f"{text(torch.get('version'), 80)}, {cuda_text}"))
    elif torch.get("importing"):
        rows.append(("torch", "being imported by the target right now (ask again in a few seconds)"))
    else:
        rows.append(("torch", "not imported by the target"))
    hooks = data.get("active_hooks") or []
    rows.append(("instrumentation", "\n".join(text(h) for h in hooks) if hooks else "none"))
    return rows


def render_status(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in status_rows(data, txt, fmt):
        table.add_row(label, value)
    console.print(table)
    if data.get("arm"):
        from flight_profiler.cli.agent_commands.arm import render_trigger_list

        render_trigger_list(data["arm"], console)


def render_stack(data: dict[str, Any], console: Console) -> None:
    for thread in data["threads"]:
        tags = [t for t, on in (("main", thread.get("main")), ("daemon", thread.get("daemon")),
                                ("agent", thread.get("agent"))) if on]
        native = thread.get("native_id")
        head = f"Thread {txt(thread.get('name'), 200)}" + (f" (tid {fmt(native, 'd')})" if native else "")
        progress = thread.get("progress")
        if progress:
            head += (f", {fmt(progress.get('switches'), 'd')} context switches, "
                     f"{fmt(progress.get('cpu_ticks'), 'd')} CPU ticks")
        suffix = f" \\[{', '.join(tags)}]" if tags else ""
        console.print(f"[bold]{head}[/bold]{suffix}", highlight=False)
        for frame in thread["frames"]:
            console.print(
                f'  File "{txt(frame["file"])}", line {fmt(frame.get("line"), "d")}, '
                f"in [cyan]{txt(frame['function'], 400)}[/cyan]",
                highlight=False, soft_wrap=True,
            )
        console.print()
    hidden = data.get("hidden_agent_threads") or 0
    if hidden:
        console.print(f"[dim]{hidden} agent thread(s) hidden; `stack --all` shows them[/dim]")


def render_detach(data: dict[str, Any], console: Console) -> None:
    removed = data.get("hooks_removed") or 0
    console.print(f"detached: agent stopped, {removed} hook(s) removed")
