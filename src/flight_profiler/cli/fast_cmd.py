"""``flight_profiler PID --cmd "status"`` without click (issue 23: click and the command grammar
built on it were a third of a later command's start-up).

Only the plainest shape is taken here: a pid, ``-c/--cmd`` with one of the commands whose words
have no options worth a parser (:data:`QUICK`), and ``--json``, ``--timeout S``, ``--deadline S``
each at most once, values written as plain decimals within their ranges. Anything else (another
option, a repeated one, ``--cmd=...``, a command with options, a value click would refuse or
read differently) returns None from :func:`plan` and goes the normal click path, so that every
message and exit code stays click's. What runs then is what ``attach`` runs for the same
options (cli/attach_cmd.py): ``connect`` (injecting if no agent answers), ``execute``, the same
error printer (cli/error_output.py). tests/unit/test_fast_cmd.py runs both paths side by side.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from typing import Any

    from flight_profiler.requests.base import AgentRequest

# What attach's options accept (cli/attach_cmd.py): --timeout FiniteFloatRange(0.1, 3600),
# default 10; --deadline FiniteFloatRange(0.1, 86400), default None.
_TIMEOUT = (0.1, 3600.0)
_DEADLINE = (0.1, 86400.0)

# The command lines taken without the grammar, as split into words -> the builder call that
# requests.commands makes for them (tests/unit/test_fast_cmd.py checks each equals parse()).
QUICK: dict[tuple[str, ...], tuple[str, dict[str, Any]]] = {
    ("status",): ("status", {}),
    ("stack",): ("stack", {}),
    ("stack", "-a"): ("stack", {"show_all": True}),
    ("stack", "--all"): ("stack", {"show_all": True}),
    ("stack", "--progress"): ("stack", {"progress": True}),
    ("torch", "fr"): ("fr", {}),
}


class Plan:
    """What ``attach`` would be called with."""

    def __init__(self, pid: int, request: AgentRequest, as_json: bool, timeout: float,
                 deadline: float | None) -> None:
        self.pid = pid
        self.request = request
        self.as_json = as_json
        self.timeout = timeout
        self.deadline = deadline


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _number(text: str, bounds: tuple[float, float]) -> float | None:
    """``text`` as a float when it is a plain decimal (``5``, ``0.5``, ``.5``) within ``bounds``:
    the other forms click's float type reads (``1e3``, ``1_0``, `` 5``) go its way."""
    whole, _, fraction = text.partition(".")
    if not (whole or fraction) or not all(_digits(part) for part in (whole, fraction) if part):
        return None
    value = float(text)
    return value if bounds[0] <= value <= bounds[1] else None


def quick_request(command_line: str) -> AgentRequest | None:
    """The request for one of the :data:`QUICK` command lines, else None."""
    if len(command_line) > 64:  # none of them is longer; the grammar bounds the rest
        return None
    words = tuple(command_line.split())
    if words not in QUICK or " ".join(words) != command_line.strip():
        return None  # tabs, newlines, quotes: left to shlex and the grammar
    builder, kwargs = QUICK[words]
    from flight_profiler.requests import basic

    request: AgentRequest = getattr(basic, builder)(**kwargs)
    return request


def plan(args: list[str]) -> Plan | None:
    """What ``attach`` would do for ``args``, when they have the plain shape; else None."""
    if not args or not _digits(args[0]):
        return None
    seen: dict[str, str | None] = {}
    i = 1
    while i < len(args):
        word = args[i]
        name = "--cmd" if word == "-c" else word
        if name in seen:
            return None
        if name == "--json":
            seen[name] = None
            i += 1
            continue
        if name not in ("--cmd", "--timeout", "--deadline") or i + 1 >= len(args):
            return None
        seen[name] = args[i + 1]
        i += 2
    command_line = seen.get("--cmd")
    if command_line is None:
        return None  # the shell
    request = quick_request(command_line)
    if request is None:
        return None
    timeout: float | None = 10.0
    if "--timeout" in seen:
        timeout = _number(seen["--timeout"] or "", _TIMEOUT)
    deadline = None
    if "--deadline" in seen:
        deadline = _number(seen["--deadline"] or "", _DEADLINE)
        if deadline is None:
            return None
    if timeout is None:
        return None
    return Plan(int(args[0]), request, "--json" in seen, timeout, deadline)


def run(planned: Plan) -> None:
    """Run ``planned`` as ``attach`` does, ending as ``run_cli`` does on an error."""
    from flight_profiler.cli.error_output import exit_with
    from flight_profiler.errors import FlightProfilerError, Interrupted

    try:
        from flight_profiler import api
        from flight_profiler.cli import runner

        session = api.connect(planned.pid, timeout=planned.timeout)
        try:
            plain = None
            if planned.request.cmd == "status" and not planned.as_json:
                from flight_profiler.cli import plain_status

                plain = plain_status.render  # the table without importing rich, for a script
            completed = runner.execute(session, planned.request, planned.as_json,
                                       planned.deadline, plain)
        finally:
            session.close()
        if not completed:  # execute() said so when it cancelled the request
            raise Interrupted(reported=True)
    except FlightProfilerError as err:
        exit_with(err, planned.as_json)
    except KeyboardInterrupt:
        exit_with(Interrupted(), planned.as_json)
    sys.stdout.flush()
