"""How the CLI ends: one clear error line (or a JSON error) and the documented exit code."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from flight_profiler.errors import ExitCode, FlightProfilerError

# click >= 8.2 renamed NoArgsIsHelp to NoArgsIsHelpError.
_NoArgsIsHelp: type[Exception] = (getattr(click.exceptions, "NoArgsIsHelpError", None)
                                  or getattr(click.exceptions, "NoArgsIsHelp"))  # noqa: B009


def wants_json(argv: list[str]) -> bool:
    return "--json" in argv


def print_error(err: FlightProfilerError, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"error": err.to_dict()}) + "\n")
        sys.stdout.flush()
        return
    sys.stderr.write(f"error: {err.message}\n")
    if err.hint:
        sys.stderr.write(f"hint: {err.hint}\n")


def run_cli(group: click.Group, argv: list[str]) -> Any:
    as_json = wants_json(argv)
    try:
        return group.main(args=argv, prog_name="flight_profiler", standalone_mode=False)
    except FlightProfilerError as err:
        print_error(err, as_json)
        sys.exit(err.exit_code)
    except _NoArgsIsHelp as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "")  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        if as_json:
            payload = {"kind": "usage", "message": exc.format_message(), "hint": "",
                       "exit_code": ExitCode.USAGE}
            sys.stdout.write(json.dumps({"error": payload}) + "\n")
        else:
            exc.show()
        sys.exit(ExitCode.USAGE if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.stderr.write("interrupted\n")
        sys.exit(ExitCode.INTERRUPTED)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(ExitCode.INTERRUPTED)
