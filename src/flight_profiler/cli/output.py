"""How the CLI ends: one clear error line (or a JSON error) and the documented exit code.

``print_error`` is the one error printer (the command line and the shells use it; it lives in
cli/error_output.py, without click, for the fast path of cli/fast_cmd.py); ``run_cli`` is where
the click path ends the process: every failure, click's own included, is turned into a
:class:`FlightProfilerError` first, so that the exit status and the ``exit_code`` of a
``--json`` error document are the same number by construction.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from flight_profiler.cli.error_output import exit_with, print_error, wants_json
from flight_profiler.errors import ExitCode, FlightProfilerError, Interrupted, UsageError

__all__ = ["exit_with", "from_click", "print_error", "run_cli", "wants_json"]

# click >= 8.2 renamed NoArgsIsHelp to NoArgsIsHelpError.
_NoArgsIsHelp: type[Exception] = (getattr(click.exceptions, "NoArgsIsHelpError", None)
                                  or getattr(click.exceptions, "NoArgsIsHelp"))  # noqa: B009


class _ClickError(FlightProfilerError):
    """A click error that is not a usage error (e.g. click.FileError): its own exit code."""

    kind = "command_failed"

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, "")
        self.exit_code = exit_code  # per instance: click chose it


def from_click(exc: click.ClickException) -> FlightProfilerError:
    """The hierarchy's error for a click exception; click's usage errors exit with USAGE (2)."""
    if isinstance(exc, click.UsageError) or exc.exit_code == ExitCode.USAGE:
        return UsageError(exc.format_message(), "")
    return _ClickError(exc.format_message(), exc.exit_code)


def run_cli(group: click.Group, argv: list[str]) -> Any:
    as_json = wants_json(argv)
    try:
        return group.main(args=argv, prog_name="flight_profiler", standalone_mode=False)
    except FlightProfilerError as err:
        exit_with(err, as_json)
    except _NoArgsIsHelp as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "")  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        if as_json:
            exit_with(from_click(exc), as_json)
        exc.show()  # click's own text: the usage line and "Try ... --help"
        sys.exit(from_click(exc).exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)  # --help, --version: not an error
    except (click.Abort, KeyboardInterrupt):
        exit_with(Interrupted(), as_json)
