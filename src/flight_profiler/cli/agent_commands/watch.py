"""`watch module [class] method`: each call's arguments, return value, exception and cost, live."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.base import fmt, txt
from flight_profiler.report.units import fmt_ms
from flight_profiler.safe_text import safe_text

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
        parts.append(f"for {fmt(data['timeout'], 'g')}s")
    if data.get("filter"):
        parts.append(f"where {txt(data['filter'])}")
    return (", " + ", ".join(parts)) if parts else ""


def make_renderers(spinner: Spinner) -> tuple[Any, Any]:
    def render_event(data: dict[str, Any], console: Console) -> None:
        kind = data.get("type")
        if kind == "watching":
            note = f" [dim]({txt(data['note'])})[/dim]" if data.get("note") else ""
            console.print(f"watching [bold]{txt(data.get('target', '?'))}[/bold]"
                          f"{_limits(data)}{note} · Ctrl-C to stop", highlight=False, soft_wrap=True)
            spinner.start(console, "waiting for calls")
            return
        spinner.pause()
        if kind == "call":
            head = f"[dim]{stamp(data.get('ts'))}[/dim] #{fmt(data.get('n'), 'd')} {txt(data.get('thread'), 200)}"
            head += f"  cost [bold]{fmt_ms(data.get('cost_ms') or 0)}[/bold]"
            if data.get("exception"):
                head += f"  [red]raised {txt(data['exception'])}[/red]"
            console.print(head, highlight=False)
            pairs = [(safe_text(label, 200), text) for label, text in data.get("values") or []]
            width = max((len(label) for label, _ in pairs), default=0)
            for label, text in pairs:
                if label == "cost":
                    continue
                console.print(f"  {txt(label.ljust(width), None)} = {txt(text)}", highlight=False, soft_wrap=True)
        elif kind == "dropped":
            console.print(f"[yellow]… {fmt(data.get('count'), 'd')} matching call(s) not shown: the stream "
                          f"could not keep up ({fmt(data.get('total'), 'd')} so far)[/yellow]", highlight=False)
        elif kind == "filter_error":
            console.print(f"[yellow]filter raised {txt(data.get('message'))}; such calls "
                          f"count as not matching[/yellow]", highlight=False)
        spinner.resume()

    def render_result(data: dict[str, Any], console: Console) -> None:
        spinner.stop()
        console.print(summary(data, "watch"), highlight=False, soft_wrap=True)

    return render_event, render_result


REASONS = {"count": "count reached", "timeout": "timeout", "cancelled": "cancelled"}


def summary(data: dict[str, Any], what: str) -> str:
    reason = data.get("reason")
    text = (f"{what} ended ({REASONS.get(reason, txt(reason, 80)) if isinstance(reason, str) else txt(reason, 80)}) "
            f"after {fmt(data.get('elapsed_s') or 0, '.1f')}s: {fmt(data.get('calls') or 0, ',')} call(s), "
            f"{fmt(data.get('matched') or 0, ',')} matched, {fmt(data.get('events') or 0, ',')} shown")
    if data.get("dropped"):
        text += f", [yellow]{fmt(data['dropped'], ',')} dropped (stream could not keep up)[/yellow]"
    if data.get("filter_errors"):
        text += (f", [yellow]filter raised {fmt(data['filter_errors'], ',')} time(s): "
                 f"{txt(data.get('first_filter_error') or '')}[/yellow]")
    if data.get("skipped_already_profiled"):
        text += f", {fmt(data['skipped_already_profiled'], 'd')} skipped (thread already profiled)"
    return text + "; hooks removed"
