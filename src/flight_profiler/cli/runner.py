"""Run one request on a session and show its answers (human or JSON): the one-shot `--cmd`,
the shell and `--all-ranks` all print through here."""

from __future__ import annotations

import json
import sys

from flight_profiler.cli.agent_commands import rendering
from flight_profiler.cli.agent_commands.base import render_json
from flight_profiler.client import RequestInterrupted, RequestTimeout

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from typing import Any, Callable

    from rich.console import Console

    from flight_profiler.api import Session
    from flight_profiler.requests import AgentRequest

_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console()
    return _console


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def execute(session: Session, req: AgentRequest, as_json: bool,
            deadline: float | None = None,
            plain: Callable[[dict[str, Any]], str | None] | None = None) -> bool:
    """Run one parsed request on ``session`` and render it. Returns False if interrupted.

    ``deadline``: seconds before the request is cancelled (None: its own limit plus a margin,
    requests/deadlines.py). ``plain(result)``: the result as text to print without rich, or
    None to let rich render it (cli/plain_status.py).

    Ctrl-C during a stream sends ``cancel``: the agent removes the request's hooks and sends its
    final result, which is still rendered.
    """
    shown = rendering(req.cmd)
    if as_json:
        def on_event(data: dict[str, Any]) -> None:
            print_json({"event": data})
    else:
        render_event = shown.event

        def on_event(data: dict[str, Any]) -> None:
            (render_event or render_json)(data, console())

    def say_cancelling() -> None:
        sys.stderr.write("interrupted: cancelling (the agent removes its hooks)...\n")

    try:
        result = session.execute(req, on_event, deadline, on_cancel=say_cancelling)
    except RequestTimeout as late:
        if late.partial is not None and not as_json:  # what the agent had at the deadline
            shown.result(late.partial, console())
        raise
    except RequestInterrupted as stopped:
        if stopped.error is not None:
            raise stopped.error from None
        if stopped.result is None:
            return False
        result, interrupted = stopped.result, True
    else:
        interrupted = False
    text = None if as_json or plain is None else plain(result)
    if as_json:
        print_json(result)
    elif text is not None:
        sys.stdout.write(text)
    else:
        shown.result(result, console())
    return not interrupted
