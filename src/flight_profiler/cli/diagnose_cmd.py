"""`flight_profiler diagnose PID [module [class] method]`: the whole workflow in one go."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from flight_profiler.cli.params import FiniteFloatRange
from flight_profiler.errors import ExitCode, FlightProfilerError
from flight_profiler.report.models import SEVERITIES

if TYPE_CHECKING:
    from rich.console import Console

    from flight_profiler.api import Session
    from flight_profiler.diagnose.model import DiagnoseResult

# Injecting the agent took up to several seconds on a loaded 2-core machine: a short --timeout
# (meant for the method's calls) must not make the attach itself fail.
ATTACH_TIMEOUT_MIN = 10.0


@click.command(
    name="diagnose",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=(
        "Examples:\n\n"
        "  flight_profiler diagnose 1234 train train_step\n\n"
        "  flight_profiler diagnose 1234 mypkg.trainer Trainer step --calls 20 --out diag/\n\n"
        "  flight_profiler diagnose 1234 --duration 10          (no method: a time window)\n\n"
        "  flight_profiler diagnose 1234 train train_step --fail-on warning --json   (CI)\n\n"
        "Exit codes: 0 done, 9 a finding reached --fail-on, 12 some phases failed (the report "
        "says which evidence is missing), others as for every command "
        "(docs/exit-codes.md). Details: docs/diagnose.md."
    ),
)
@click.argument("pid", type=int)
@click.argument("target", nargs=-1)
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory for the report and every artefact "
                   "[default: ./flight_profiler-PID-YYYYmmdd-HHMMSS].")
@click.option("--calls", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Calls of the method each phase observes (profile, record, watch, trace).")
@click.option("--duration", type=FiniteFloatRange(0.1, 3600), default=5.0, show_default=True,
              help="Seconds: the profile window when no method is given, and the least time "
                   "between the before/after censuses (growth needs time).")
@click.option("--timeout", type=FiniteFloatRange(0.5, 3600), default=30.0, show_default=True,
              help="Seconds each phase may wait for the method to be called (and to attach, at least 10).")
@click.option("--fail-on", type=click.Choice(SEVERITIES), default=None,
              help="Exit with code 9 when a finding is at least this severe (for CI).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result (phases, findings, files) as one JSON document.")
@click.option("--all-ranks", is_flag=True,
              help="PID is a torchrun launcher or rank: diagnose every local rank in parallel, "
                   "one report for the job (docs/ranks.md).")
@click.option("--ranks", "ranks_spec", metavar="LIST", help="With --all-ranks: only these, e.g. 0,3-5.")
@click.option("--arm", "arm_spec", metavar="LIST",
              help='After the diagnosis, leave these triggers armed in the job, evidence under '
                   'OUT/armed: what follows `arm --on`, comma-separated, e.g. "hang 600,nan,slow 3" '
                   "(docs/arm.md). The agent then stays in the job.")
def diagnose(pid: int, target: tuple[str, ...], out_dir: str | None, calls: int,
             duration: float, timeout: float, fail_on: str | None, as_json: bool,
             all_ranks: bool, ranks_spec: str | None, arm_spec: str | None) -> None:
    """Diagnose the live Python process PID: memory, profile, cost, call tree, growth, report.

    With `module [class] method` (e.g. `train train_step` or `mypkg Trainer step`) the phases
    observe that method's next calls; without one, the profile covers a --duration window.
    Phases that cannot run (no CUDA, torch not imported, the method not called in time) are
    reported as skipped and the others still run. Progress goes to stderr.
    """
    from flight_profiler.diagnose import DiagnoseOptions, MethodTarget, default_out_dir
    from flight_profiler.diagnose.arming import arm_all, parse_arm_list
    from flight_profiler.diagnose.driver import SessionDriver
    from flight_profiler.diagnose.progress import make_progress
    from flight_profiler.diagnose.workflow import run_diagnosis

    method = MethodTarget.parse(target) if target else None
    if all_ranks or ranks_spec is not None:
        from flight_profiler.cli.diagnose_job_cmd import diagnose_all_ranks

        diagnose_all_ranks(pid, ranks_spec, method, out_dir, calls, duration, timeout,
                           max(ATTACH_TIMEOUT_MIN, timeout), fail_on, as_json, arm_spec)
        return
    options = DiagnoseOptions(pid=pid, target=method, out_dir=out_dir or default_out_dir(pid),
                              calls=calls, duration=duration, timeout=timeout)
    arming = parse_arm_list(arm_spec, options.out_dir) if arm_spec is not None else []
    created = not os.path.exists(options.out_dir)
    session = attach(pid, options.out_dir, max(ATTACH_TIMEOUT_MIN, timeout))
    driver = SessionDriver(session, connect_timeout=max(ATTACH_TIMEOUT_MIN, timeout))
    progress = make_progress()
    try:
        result = run_diagnosis(driver, options, progress, session.attach_seconds)
        if arming:
            result.armed = arm_all(driver, arming)
    except BaseException:
        if created and os.path.isdir(options.out_dir) and not os.listdir(options.out_dir):
            os.rmdir(options.out_dir)  # nothing was written: leave nothing behind
        raise
    finally:
        progress.close()
        _leave(driver, keep_agent=bool(arming))
    finish(result, fail_on, as_json)


def attach(pid: int, out_dir: str, timeout: float) -> Session:
    """Check the pid, create the output directory, attach; a failure leaves no empty directory."""
    from flight_profiler.api import connect
    from flight_profiler.attach import process
    from flight_profiler.diagnose.outputs import prepare_out_dir

    process.inspect(pid, check_permissions=False)  # a wrong pid fails before anything is created
    created = not os.path.exists(out_dir)
    prepare_out_dir(out_dir, pid)  # a bad --out fails before the target is touched
    try:
        return connect(pid, timeout=timeout)
    except BaseException:
        if created and not os.listdir(out_dir):
            os.rmdir(out_dir)
        raise


def _leave(driver: object, keep_agent: bool = False) -> None:
    """Leave the target as found: detach an agent this command injected, else just disconnect
    (``keep_agent``: triggers were armed in it, and detach would disarm them)."""

    session = getattr(driver, "session", None)
    if session is None:
        return
    try:
        if getattr(driver, "injected", False) and session.client is not None and not keep_agent:
            session.detach()
    except FlightProfilerError:
        pass
    finally:
        session.close()


def finish(result: DiagnoseResult, fail_on: str | None, as_json: bool) -> None:
    """Print the summary (or JSON); a verdict other than 0 (--fail-on, incomplete) is raised."""
    from flight_profiler.diagnose import summary
    from flight_profiler.diagnose.evidence import missing
    from flight_profiler.diagnose.outputs import verdict

    report = result.report

    gaps = missing(result)
    code = ExitCode.OK
    if fail_on and report is not None and report.reaches(fail_on):
        code = ExitCode.FINDINGS
    elif fail_on and report is None:
        code = ExitCode.COMMAND_FAILED  # CI asked for a verdict and none could be made
    elif gaps:
        code = ExitCode.INCOMPLETE  # a quiet report over missing evidence is no all-clear
    elif result.armed is not None and not all(a["armed"] for a in result.armed):
        code = ExitCode.COMMAND_FAILED  # a trigger asked for is not armed: nobody is watching
    if as_json:
        sys.stdout.write(json.dumps(summary.to_json(result, code), default=str) + "\n")
        sys.stdout.flush()
    else:
        from rich.console import Console

        summary.render(result, Console())
        if result.armed is not None:
            render_armed(result.armed, result.options.pid, Console())
    if code:
        unarmed = [a for a in result.armed or [] if not a["armed"]]
        err = verdict(code, fail_on, len(gaps)) if not (code == ExitCode.COMMAND_FAILED and unarmed) \
            else FlightProfilerError(f"{len(unarmed)} trigger(s) of --arm could not be armed: exit {code}",
                                     "", reported=True)
        if not as_json:  # with --json the result document already carries the code
            from rich.console import Console

            Console(stderr=True).print(err.message, highlight=False)
        raise err


def render_armed(armed: list[dict[str, Any]], pid: int, console: Console) -> None:
    from flight_profiler.safe_text import safe_markup as escape  # text from the agent

    for a in armed:
        if a["armed"]:
            console.print(f"armed: {escape(a['line'])}", highlight=False)
        else:
            console.print(f"[red]not armed[/red]: {escape(a['line'])}: {escape(a['error'] or '?')}",
                          highlight=False)
    if any(a["armed"] for a in armed):
        console.print(f"  the agent stays in pid {pid} to watch: `flight_profiler {pid} --cmd status`; "
                      f"`--cmd disarm` (or detach) removes them; `flight_profiler report "
                      f"{escape(armed[0]['out'] or '')}` reads what fired", highlight=False)
