"""`flight_profiler demo`: start a bundled sample workload, diagnose it, show the report, stop it."""

from __future__ import annotations

import os
import time

import click

from flight_profiler.cli.params import FiniteFloatRange
from flight_profiler.workloads import DEFAULT_DEMO, WORKLOADS


@click.command(
    name="demo",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=("Workloads: " + "; ".join(
        f"{name}: {summary}" for name, (_, summary) in WORKLOADS.items()) + "."),
)
@click.option("--workload", type=click.Choice(list(WORKLOADS)), default=DEFAULT_DEMO,
              show_default=True, help="Which sample workload to run and diagnose.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory for the report and artefacts "
                   "[default: ./flight_profiler-demo-WORKLOAD-YYYYmmdd-HHMMSS].")
@click.option("--calls", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Calls of the step each phase observes.")
@click.option("--duration", type=FiniteFloatRange(0.5, 600), default=5.0, show_default=True,
              help="Least seconds between the before/after tensor censuses.")
@click.option("--timeout", type=FiniteFloatRange(1, 600), default=60.0, show_default=True,
              help="Seconds to wait for the workload to start, to attach, and per phase.")
def demo(workload: str, out_dir: str | None, calls: int, duration: float, timeout: float) -> None:
    """Start a sample PyTorch workload with a planted problem, diagnose it, show the report.

    The first thing to run after installing: it shows what `flight_profiler diagnose PID ...`
    does against a live training loop, then stops the workload. It needs torch in this Python.
    """
    from rich.console import Console

    from flight_profiler.cli.diagnose_cmd import _leave, attach, finish
    from flight_profiler.diagnose import DiagnoseOptions
    from flight_profiler.diagnose.driver import SessionDriver
    from flight_profiler.diagnose.launch import start_workload
    from flight_profiler.diagnose.progress import make_progress
    from flight_profiler.diagnose.workflow import run_diagnosis

    console = Console()
    expected, summary = WORKLOADS[workload]
    out = os.path.abspath(out_dir or f"flight_profiler-demo-{workload}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    console.print(f"[bold]demo:[/bold] starting workload [cyan]{workload}[/cyan] ({summary})",
                  highlight=False)
    job = start_workload(workload, os.path.join(out, "workload.log"))
    try:
        target = job.wait_ready(timeout)
        console.print(f"demo: workload running as pid {job.pid}; now the equivalent of\n"
                      f"  flight_profiler diagnose {job.pid} {target.words} --out {out}\n",
                      highlight=False)
        session = attach(job.pid, out, timeout)
        driver = SessionDriver(session, connect_timeout=timeout)
        progress = make_progress()
        options = DiagnoseOptions(pid=job.pid, target=target, out_dir=out, calls=calls,
                                  duration=duration, timeout=timeout)
        try:
            result = run_diagnosis(driver, options, progress, session.attach_seconds)
        finally:
            progress.close()
            _leave(driver)
    finally:
        job.stop()
    finish(result, None, as_json=False)
    top = result.report.findings[0].rule if result.report and result.report.findings else None
    if expected:
        verdict = "found it" if top == expected else f"the top finding is {top or 'none'}"
        console.print(f"\ndemo: the planted problem is [bold]{expected}[/bold]: {verdict}.",
                      highlight=False)
    console.print(f"demo: workload {workload} stopped. Open in a browser:", highlight=False)
    console.print(f"  {result.outputs.get('html', out)}", highlight=False, soft_wrap=True)
    console.print("or try another: flight_profiler demo --workload "
                  f"{'tiny_ops' if workload != 'tiny_ops' else 'dataloader_bound'}", highlight=False)
