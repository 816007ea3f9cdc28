"""The one error printer, without click: the command line, the shells and the fast path of a
command to an agent (cli/fast_cmd.py) print every failure through here, so that a message and
its exit code are the same whichever path ran (cli/output.py re-exports these)."""

from __future__ import annotations

import json
import sys

from flight_profiler.errors import FlightProfilerError, Interrupted
from flight_profiler.safe_text import safe_text

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import NoReturn


def wants_json(argv: list[str]) -> bool:
    return "--json" in argv


def print_error(err: FlightProfilerError, as_json: bool, one_line: bool = False) -> None:
    """Show ``err``: a JSON document on stdout with --json, else ``error:``/``hint:`` on stderr.

    ``one_line`` is the shell's form (the hint in parentheses), so that the prompt comes back
    right below. An error the command already reported, and an interrupt, print no JSON.
    Messages often quote what a target or a file said (an agent's error, a name): their control
    characters are shown escaped (``safe_text``), never sent to the terminal; JSON escapes them.
    """
    if err.reported:
        return
    if isinstance(err, Interrupted):
        sys.stderr.write(f"{safe_text(err.message)}\n")
        return
    if as_json:
        sys.stdout.write(json.dumps({"error": err.to_dict()}) + "\n")
        sys.stdout.flush()
        return
    message, hint = safe_text(err.message), safe_text(err.hint)
    if one_line:
        hint = f" (hint: {hint})" if hint else ""
        sys.stderr.write(f"error: {message}{hint}\n")
        return
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")


def exit_with(err: FlightProfilerError, as_json: bool) -> NoReturn:
    print_error(err, as_json)
    sys.exit(err.exit_code)
