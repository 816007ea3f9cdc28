"""`flight_profiler diagnose PID [module [class] method]`: the whole workflow in one go."""

from __future__ import annotations

import json
import sys

import click

from flight_profiler.errors import ExitCode

SEVERITIES = ("info", "warning", "critical")


@click.command(
    name="diagnose",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=(
        "Examples:\n\n"
        "  flight_profiler diagnose 1234 train train_step\n\n"
        "  flight_profiler diagnose 1234 mypkg.trainer Trainer step --calls 20 --out diag/\n\n"
        "  flight_profiler diagnose 1234 --duration 10          (no method: a time window)\n\n"
        "  flight_profiler diagnose 1234 train train_step --fail-on warning --json   (CI)\n\n"
        "Exit codes: 0 done, 9 a finding reached --fail-on, others as for every command "
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
@click.option("--duration", type=click.FloatRange(0.1, 3600), default=5.0, show_default=True,
              help="Seconds: the profile window when no method is given, and the least time "
                   "between the before/after censuses (growth needs time).")
@click.option("--timeout", type=click.FloatRange(0.5, 3600), default=30.0, show_default=True,
              help="Seconds to attach, and that each phase may wait for the method to be called.")
@click.option("--fail-on", type=click.Choice(SEVERITIES), default=None,
              help="Exit with code 9 when a finding is at least this severe (for CI).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result (phases, findings, files) as one JSON document.")
def diagnose(pid: int, target: tuple[str, ...], out_dir: str | None, calls: int,
             duration: float, timeout: float, fail_on: str | None, as_json: bool) -> None:
    """Diagnose the live Python process PID: memory, profile, cost, call tree, growth, report.

    With `module [class] method` (e.g. `train train_step` or `mypkg Trainer step`) the phases
    observe that method's next calls; without one, the profile covers a --duration window.
    Phases that cannot run (no CUDA, torch not imported, the method not called in time) are
    reported as skipped and the others still run. Progress goes to stderr.
    """
    from flight_profiler.api import connect
    from flight_profiler.diagnose import DiagnoseOptions, MethodTarget, default_out_dir
    from flight_profiler.diagnose.driver import SessionDriver
    from flight_profiler.diagnose.progress import make_progress
    from flight_profiler.diagnose.workflow import run_diagnosis

    method = MethodTarget.parse(target) if target else None
    options = DiagnoseOptions(pid=pid, target=method, out_dir=out_dir or default_out_dir(pid),
                              calls=calls, duration=duration, timeout=timeout)
    session = connect(pid, timeout=timeout)
    driver = SessionDriver(session, connect_timeout=timeout)
    progress = make_progress()
    try:
        result = run_diagnosis(driver, options, progress)
    finally:
        progress.close()
        _leave(driver)
    finish(result, fail_on, as_json)


def _leave(driver: object) -> None:
    """Leave the target as found: detach an agent this command injected, else just disconnect."""
    from flight_profiler.errors import FlightProfilerError

    session = getattr(driver, "session", None)
    if session is None:
        return
    try:
        if session.injected and session.client is not None:
            session.detach()
    except FlightProfilerError:
        pass
    finally:
        session.close()


def finish(result: object, fail_on: str | None, as_json: bool) -> None:
    """Print the summary (or JSON) and end with the exit code --fail-on asks for."""
    from flight_profiler.diagnose import summary
    from flight_profiler.diagnose.model import DiagnoseResult

    assert isinstance(result, DiagnoseResult)
    report = result.report
    code = ExitCode.OK
    if fail_on and report is not None and report.reaches(fail_on):
        code = ExitCode.FINDINGS
    if as_json:
        sys.stdout.write(json.dumps(summary.to_json(result, code), default=str) + "\n")
        sys.stdout.flush()
    else:
        from rich.console import Console

        summary.render(result, Console())
        if code:
            Console(stderr=True).print(f"findings reached --fail-on {fail_on}: exit {code}",
                                       highlight=False)
    if code:
        sys.exit(code)
