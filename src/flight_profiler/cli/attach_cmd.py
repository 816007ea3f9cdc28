"""`flight_profiler PID [--cmd "..."]`: attach, run one command (or open the shell), render."""

from __future__ import annotations

import click

from flight_profiler.attach.methods import METHODS
from flight_profiler.cli.params import FiniteFloatRange
from flight_profiler.cli.runner import console, execute, print_json
from flight_profiler.errors import FlightProfilerError, Interrupted


@click.command(name="attach")
@click.argument("pid", type=int)
@click.option("-c", "--cmd", "command_line", metavar="COMMAND",
              help='Run one command and exit, e.g. --cmd "stack". Without it: interactive shell.')
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output: events as JSON lines, then the result as one JSON "
                   'document; errors as {"error": {...}}.')
@click.option("--timeout", type=FiniteFloatRange(0.1, 3600), default=10.0, show_default=True,
              help="Seconds to wait for the agent to come up.")
@click.option("--deadline", type=FiniteFloatRange(0.1, 86400), default=None, metavar="S",
              help="Seconds a command may run before it is cancelled (wall clock). Default: its "
                   "own limit (watch/trace --timeout, profile --duration...) plus 30 s for "
                   "status, stack, detach, torch fr, 300 s for the other torch commands; watch "
                   "and trace without --timeout run until Ctrl-C. Exit code 13 when it is reached.")
@click.option("--method", type=click.Choice(METHODS), default="auto", show_default=True,
              help="How to inject: auto picks sys.remote_exec (Python 3.14, same version as the "
                   "CLI), else the built-in ptrace injector (x86-64), else gdb after a self-test; "
                   "pyrasite only if installed.")
@click.option("-v", "--verbose", is_flag=True, help="Say what the attach does, on stderr.")
@click.option("--all-ranks", is_flag=True,
              help="PID is a torchrun launcher or a rank: run on every local rank of its job, in "
                   "parallel, results labelled by rank (docs/ranks.md).")
@click.option("--ranks", "ranks_spec", metavar="LIST",
              help="With --all-ranks (implies it): only these ranks, e.g. 0,3-5.")
def attach(pid: int, command_line: str | None, as_json: bool, timeout: float,
           deadline: float | None, method: str, verbose: bool, all_ranks: bool,
           ranks_spec: str | None) -> None:
    """Attach to the live Python process PID and run COMMAND, or open a shell.

    \b
    Examples:
      flight_profiler 1234 --cmd stack
      flight_profiler 1234 --cmd status --json
      flight_profiler 1234                      (shell; type `help`)
      flight_profiler 1234 --all-ranks --cmd stack   (every rank of a torchrun job)
    """
    from flight_profiler.api import connect
    from flight_profiler.cli import ranks_cmd
    from flight_profiler.requests import HelpShown, parse

    if command_line is not None:
        command_line, typed_all, typed_spec = ranks_cmd.extract_rank_options(command_line)
        all_ranks, ranks_spec = all_ranks or typed_all, ranks_spec or typed_spec
    if ranks_cmd.check_options(all_ranks, ranks_spec):
        if command_line is None:
            ranks_cmd.run_all_ranks_shell(pid, ranks_spec, as_json, timeout, method, deadline)
        else:
            try:
                every_rank_ok = ranks_cmd.run_all_ranks(pid, command_line, ranks_spec, as_json,
                                                        timeout, method, deadline)
            except HelpShown as shown:
                raise click.exceptions.Exit(shown.code) from None
            if not every_rank_ok:  # each rank's failure is shown above
                raise FlightProfilerError("some ranks failed", reported=True)
        return

    if command_line is not None:
        # Parse before touching the target: a malformed command leaves it unharmed.
        try:
            req = parse(command_line)
        except HelpShown as shown:
            raise click.exceptions.Exit(shown.code) from None
        if req.cmd == "detach":
            _detach(pid, timeout, verbose, as_json, deadline)
            return
        session = connect(pid, timeout=timeout, method=method, verbose=verbose)
        try:
            completed = execute(session, req, as_json, deadline)
        finally:
            session.close()
        if not completed:  # execute() said so when it cancelled the request
            raise Interrupted(reported=True)
        return
    from flight_profiler.cli.shell import run_shell

    session = connect(pid, timeout=timeout, method=method, verbose=verbose)
    try:
        run_shell(session, as_json, deadline)
    finally:
        session.close()


def _detach(pid: int, timeout: float, verbose: bool, as_json: bool,
            deadline: float | None = None) -> None:
    """`detach` never injects: with no agent answering there is nothing to remove."""
    from flight_profiler.api import NotAttached, connect
    from flight_profiler.requests import basic

    try:
        session = connect(pid, timeout=timeout, verbose=verbose, inject=False)
    except NotAttached as exc:
        if as_json:
            print_json({"detached": False, "reason": exc.message, "hint": exc.hint})
        else:
            console().print(f"nothing to detach: {exc.message}\n  hint: {exc.hint}",
                            markup=False, highlight=False)
        return
    try:
        execute(session, basic.detach(), as_json, deadline)
    finally:
        session.close()
