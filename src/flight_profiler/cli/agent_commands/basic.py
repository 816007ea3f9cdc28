"""`status`, `stack`, `detach`: the commands every session starts with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def render_status(data: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    py = data.get("python", {})
    torch = data.get("torch", {})
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("agent", f"{data.get('agent_version')} (up {data.get('uptime_s', 0):.1f}s)")
    table.add_row("pid", str(data.get("pid")))
    table.add_row("python", f"{py.get('version')} {py.get('executable')}")
    table.add_row("argv", " ".join(py.get("argv") or []))
    threads = data.get("threads", {})
    table.add_row("threads", f"{threads.get('total')} ({threads.get('agent')} of them the agent's)")
    if torch.get("imported"):
        cuda = torch.get("cuda_available")
        cuda_text = {True: "CUDA available", False: "CUDA not available", None: "CUDA unknown"}[cuda]
        if torch.get("cuda_error"):
            cuda_text += f" ({torch['cuda_error']})"
        table.add_row("torch", f"{torch.get('version')}, {cuda_text}")
    else:
        table.add_row("torch", "not imported by the target")
    hooks = data.get("active_hooks") or []
    table.add_row("instrumentation", "\n".join(hooks) if hooks else "none")
    console.print(table)


def render_stack(data: dict[str, Any], console: Console) -> None:
    from rich.markup import escape

    for thread in data.get("threads", []):
        tags = [t for t, on in (("main", thread.get("main")), ("daemon", thread.get("daemon")),
                                ("agent", thread.get("agent"))) if on]
        native = thread.get("native_id")
        head = f"Thread {thread.get('name')!s}" + (f" (tid {native})" if native else "")
        progress = thread.get("progress")
        if isinstance(progress, dict):
            head += f", {progress.get('switches')} context switches, {progress.get('cpu_ticks')} CPU ticks"
        suffix = escape(f" [{', '.join(tags)}]") if tags else ""
        console.print(f"[bold]{escape(head)}[/bold]{suffix}", highlight=False)
        for frame in thread.get("frames", []):
            console.print(
                f'  File "{escape(str(frame["file"]))}", line {frame["line"]}, '
                f"in [cyan]{escape(str(frame['function']))}[/cyan]",
                highlight=False, soft_wrap=True,
            )
        console.print()
    hidden = data.get("hidden_agent_threads", 0)
    if hidden:
        console.print(f"[dim]{hidden} agent thread(s) hidden; `stack --all` shows them[/dim]")


def render_detach(data: dict[str, Any], console: Console) -> None:
    removed = data.get("hooks_removed", 0)
    console.print(f"detached: agent stopped, {removed} hook(s) removed")
