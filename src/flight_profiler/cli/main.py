"""Entry point of the ``flight_profiler`` console script.

Nothing is imported before ``main`` runs, so that a Ctrl-C in the first moments (while click and
the command modules load) ends with one line and exit code 130 instead of a traceback.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point; turns FlightProfilerError into one line and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args in ([], ["--help"], ["-h"], ["--version"]):
            # without click (half of the start-up): the same text, cli/quick_help.py
            from flight_profiler.cli import quick_help  # lazy: see the module docstring

            text = quick_help.version() if args == ["--version"] else quick_help.render()
            if text is not None:
                sys.stdout.write(text)
                sys.stdout.flush()
                sys.exit(2 if not args else 0)  # no arguments: click's usage error, with the help
        if args[:1] and args[0].isdigit() and "_FLIGHT_PROFILER_COMPLETE" not in os.environ:
            # `PID --cmd status [--json]` without click either (cli/fast_cmd.py); any other
            # shape (a shell completion request included) goes click's way below
            from flight_profiler.cli import fast_cmd  # lazy: see the module docstring

            planned = fast_cmd.plan(args)
            if planned is not None:
                fast_cmd.run(planned)
                return None
        from flight_profiler.cli.app import cli
        from flight_profiler.cli.output import run_cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    return run_cli(cli, args)
