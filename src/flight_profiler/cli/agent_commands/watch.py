"""`watch module [class] method`: each call's arguments, return value, exception and cost, live."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

import click

from flight_profiler.cli.agent_commands.base import AgentRequest, target_args
from flight_profiler.cli.params import FiniteFloatRange
from flight_profiler.report.units import fmt_ms

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

EXPR_NAMES = "params (or args), kwargs, return_obj, throw_exp, target, cost (ms)"


def check_expression(text: str, option: str) -> None:
    """Reject a malformed expression before attaching (syntax only: nothing is evaluated)."""
    from flight_profiler.agent.limits import expression_problem
    from flight_profiler.errors import UsageError

    problem = expression_problem(text)  # first: compiling a huge or deep one is the harm
    if problem:
        raise UsageError(f"{option}: {problem}", "shorten or simplify it")
    try:
        compile(text, f"<{option}>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UsageError(
            f"invalid {option} expression {_short(text)}: {getattr(exc, 'msg', None) or exc}",
            f"{option} takes Python expressions over {EXPR_NAMES}",
        ) from None


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def split_exprs(text: str) -> list[str]:
    from flight_profiler.agent.expressions import split_top_level

    return split_top_level(text)


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


@click.command(name="watch", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("words", nargs=-1, required=True, metavar="MODULE [CLASS] METHOD")
@click.option("--expr", "expr", metavar="EXPRS",
              help=f"Comma list of what to show, over {EXPR_NAMES}, or any Python expression of "
                   "them, e.g. --expr 'params[0].shape, cost'. Default: params, return_obj, cost.")
@click.option("-f", "--filter", "condition", metavar="CONDITION",
              help="Only calls where this expression is true, e.g. -f 'cost > 10' or "
                   "-f 'params[0] == 3'. A filter on params/kwargs/target only is decided "
                   "before the call and is the cheapest.")
@click.option("-e", "--exceptions", is_flag=True, help="Only calls that raised.")
@click.option("-x", "--expand", type=click.IntRange(0, 8), default=1, show_default=True,
              help="Depth to which containers and objects are expanded.")
@click.option("-n", "--count", type=click.IntRange(1), metavar="COUNT",
              help="Stop after COUNT matching calls (calls the filter rejects do not count).")
@click.option("--timeout", type=FiniteFloatRange(0, min_open=True), metavar="S",
              help="Stop after S seconds.")
@click.option("-nm", "--nested", metavar="NAME",
              help="Watch the function NAME defined inside METHOD (dotted for deeper).")
def watch(words: tuple[str, ...], expr: str | None, condition: str | None, exceptions: bool,
          expand: int, count: int | None, timeout: float | None, nested: str | None) -> AgentRequest:
    """Watch calls of MODULE [CLASS] METHOD: arguments, return value, exception, cost.

    \b
    Examples:
      watch __main__ Trainer train_step -n 3
      watch __main__ train_step --expr 'params[0].shape, cost' -f 'cost > 50'
      watch mypkg.data Loader __next__ -e
    Stops at -n, --timeout or Ctrl-C; the hook is removed in every case.
    """
    if expr:
        from flight_profiler.agent.limits import MAX_EXPRESSIONS
        from flight_profiler.errors import UsageError

        parts = split_exprs(expr)
        if len(parts) > MAX_EXPRESSIONS:
            raise UsageError(f"--expr: {len(parts)} expressions (limit {MAX_EXPRESSIONS})",
                             "watch fewer expressions at once")
        for part in parts:
            check_expression(part, "--expr")
    if condition:
        check_expression(condition, "-f")
    args = {
        "target": target_args(words, nested), "expr": expr or "", "filter": condition or "",
        "exceptions": exceptions, "expand": expand, "count": count or 0, "timeout": timeout or 0,
    }
    render_event, render_result = make_renderers(Spinner())
    return AgentRequest("watch", args, render_result, render_event)
