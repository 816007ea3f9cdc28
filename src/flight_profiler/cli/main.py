"""Entry point of the ``flight_profiler`` console script.

Nothing is imported before ``main`` runs, so that a Ctrl-C in the first moments (while click and
the command modules load) ends with one line and exit code 130 instead of a traceback.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point; turns FlightProfilerError into one line and an exit code."""
    try:
        from flight_profiler.cli.app import cli
        from flight_profiler.cli.output import run_cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    return run_cli(cli, sys.argv[1:] if argv is None else argv)
