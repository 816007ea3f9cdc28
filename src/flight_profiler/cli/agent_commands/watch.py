"""`watch module [class] method`: each call's arguments, return value, exception and cost, live."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from flight_profiler.report.units import fmt_ms

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

class Spinner:
    """A live 'waiting' line between events (terminal only); paused while an event prints."""

    def __init__(self) -> None:
        self.status: Status | None = None
        self.text = ""
        self.seen = 0

    def start(self, console: Console, text: str) -> None:
        self.text = text
        if console.is_terminal and self.status is None:
            self.status = console.status(text, spinner="dots")
            self.status.start()

    def pause(self) -> None:
        if self.status is not None:
            self.status.stop()

    def resume(self) -> None:
        self.seen += 1
        if self.status is not None:
            self.status.update(f"{self.text} · {self.seen} so far")
            self.status.start()

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def stamp(ts: Any) -> str:
    try:
        return datetime.datetime.fromtimestamp(float(ts)).strftime("%H:%M:%S.%f")[:-3]
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _limits(data: dict[str, Any]) -> str:
    parts = []
    if data.get("count"):
        parts.append(f"up to {data['count']} call(s)")
    if data.get("timeout"):
        parts.append(f"for {data['timeout']:g}s")
    if data.get("filter"):
        parts.append(f"where {data['filter']}")
    return (", " + ", ".join(parts)) if parts else ""


def make_renderers(spinner: Spinner) -> tuple[Any, Any]:
    from rich.markup import escape

    def render_event(data: dict[str, Any], console: Console) -> None:
        kind = data.get("type")
        if kind == "watching":
            note = f" [dim]({escape(data['note'])})[/dim]" if data.get("note") else ""
            console.print(f"watching [bold]{escape(data.get('target', '?'))}[/bold]"
                          f"{escape(_limits(data))}{note} · Ctrl-C to stop", highlight=False, soft_wrap=True)
            spinner.start(console, "waiting for calls")
            return
        spinner.pause()
        if kind == "call":
            head = f"[dim]{stamp(data.get('ts'))}[/dim] #{data.get('n')} {escape(str(data.get('thread')))}"
            head += f"  cost [bold]{fmt_ms(data.get('cost_ms', 0))}[/bold]"
            if data.get("exception"):
                head += f"  [red]raised {escape(data['exception'])}[/red]"
            console.print(head, highlight=False)
            pairs = data.get("values") or []
            width = max((len(label) for label, _ in pairs), default=0)
            for label, text in pairs:
                if label == "cost":
                    continue
                console.print(f"  {escape(label.ljust(width))} = {escape(text)}", highlight=False, soft_wrap=True)
        elif kind == "dropped":
            console.print(f"[yellow]… {data.get('count')} matching call(s) not shown: the stream "
                          f"could not keep up ({data.get('total')} so far)[/yellow]", highlight=False)
        elif kind == "filter_error":
            console.print(f"[yellow]filter raised {escape(str(data.get('message')))}; such calls "
                          f"count as not matching[/yellow]", highlight=False)
        spinner.resume()

    def render_result(data: dict[str, Any], console: Console) -> None:
        spinner.stop()
        console.print(summary(data, "watch"), highlight=False, soft_wrap=True)

    return render_event, render_result


REASONS = {"count": "count reached", "timeout": "timeout", "cancelled": "cancelled"}


def summary(data: dict[str, Any], what: str) -> str:
    from rich.markup import escape

    text = (f"{what} ended ({REASONS.get(data.get('reason', ''), data.get('reason'))}) after "
            f"{data.get('elapsed_s', 0):.1f}s: {data.get('calls', 0):,} call(s), "
            f"{data.get('matched', 0):,} matched, {data.get('events', 0):,} shown")
    if data.get("dropped"):
        text += f", [yellow]{data['dropped']:,} dropped (stream could not keep up)[/yellow]"
    if data.get("filter_errors"):
        text += (f", [yellow]filter raised {data['filter_errors']:,} time(s): "
                 f"{escape(data.get('first_filter_error', ''))}[/yellow]")
    if data.get("skipped_already_profiled"):
        text += f", {data['skipped_already_profiled']} skipped (thread already profiled)"
    return text + "; hooks removed"
