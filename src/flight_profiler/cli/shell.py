"""The interactive shell: `flight_profiler PID` without --cmd. Same session, same commands."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from typing import TYPE_CHECKING

from flight_profiler.cli.output import print_error
from flight_profiler.cli.runner import execute
from flight_profiler.errors import AgentLost, FlightProfilerError, UsageError
from flight_profiler.requests import HelpShown, help_text, parse
from flight_profiler.safe_text import safe_text

if TYPE_CHECKING:
    from flight_profiler.api import Session

HISTORY = os.path.join(os.path.expanduser("~"), ".flight_profiler_history")
_QUIT = {"quit", "exit", "q"}


def _setup_readline() -> object | None:
    try:
        import readline
    except ImportError:  # e.g. a Python built without it: plain input() still works
        return None
    with contextlib.suppress(OSError):
        readline.read_history_file(HISTORY)
    readline.set_history_length(1000)
    return readline


def _save_history(readline: object | None) -> None:
    if readline is None:
        return
    with contextlib.suppress(OSError):
        readline.write_history_file(HISTORY)  # type: ignore[attr-defined]


def handle_line(session: Session, line: str, as_json: bool, deadline: float | None = None) -> bool:
    """Run one shell line. Returns False when the shell should end."""
    words = line.strip().split(None, 1)
    if not words:
        return True
    if words[0] in _QUIT:
        return False
    if words[0] in ("help", "?"):
        topic = " ".join(words[1].split()) if len(words) > 1 else None
        print(help_text(topic))
        return True
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot parse command {line.strip()!r}: {exc}") from None
    if "--json" in words:  # per command in the shell, as on the command line
        as_json = True
        line = shlex.join(w for w in words if w != "--json")
    try:
        req = parse(line)
    except HelpShown:
        return True
    execute(session, req, as_json, deadline)
    return session.client is not None  # `detach` ends the session


def run_shell(session: Session, as_json: bool = False, deadline: float | None = None) -> None:
    readline = _setup_readline()
    interactive = sys.stdin.isatty()
    if interactive:
        hello = session.hello
        print(f"flight_profiler: attached to pid {session.pid} (Python "
              f"{safe_text(hello.get('python'), 40)}, agent {safe_text(hello.get('agent_version'), 40)})"
              ". Type `help`, `quit` to leave.")
    prompt = f"fp {session.pid}> " if interactive else ""
    try:
        while True:
            try:
                line = input(prompt)
            except EOFError:
                if interactive:
                    print()
                break
            except KeyboardInterrupt:
                print()
                continue
            try:
                if not handle_line(session, line, as_json, deadline):
                    break
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
            except FlightProfilerError as err:
                print_error(err, as_json, one_line=True)
                if isinstance(err, AgentLost) or session.client is None:
                    break  # the connection is gone (lost, dropped at a deadline, a frame unread)
    finally:
        _save_history(readline)
