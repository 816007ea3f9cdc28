"""`flight_profiler diagnose PID --all-ranks`: find the ranks, run the job diagnosis, render it."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from flight_profiler.errors import ExitCode, FlightProfilerError, Incomplete
from flight_profiler.safe_text import safe_text

if TYPE_CHECKING:
    from rich.console import Console

    from flight_profiler.diagnose.all_ranks import JobDiagnosis
    from flight_profiler.diagnose.model import MethodTarget


def diagnose_all_ranks(pid: int, ranks_spec: str | None, method: MethodTarget | None,
                       out_dir: str | None, calls: int, duration: float, timeout: float,
                       attach_timeout: float, fail_on: str | None, as_json: bool,
                       arm_spec: str | None = None) -> None:
    from flight_profiler.cli.ranks_cmd import job_targets
    from flight_profiler.diagnose import default_out_dir
    from flight_profiler.diagnose.all_ranks import diagnose_job, exit_code, nothing_collected
    from flight_profiler.diagnose.arming import parse_arm_list, rank_armed
    from flight_profiler.diagnose.outputs import prepare_out_dir

    out = out_dir or default_out_dir(pid, "flight_profiler-job")
    arming = parse_arm_list(arm_spec, out) if arm_spec is not None else None  # before any rank
    targets = job_targets(pid, ranks_spec)
    prepare_out_dir(out, targets[0].pid if targets else pid)
    if not as_json:
        sys.stderr.write(f"diagnosing {len(targets)} rank(s) of the job of pid {pid} into {out}\n")
    def say(text: str) -> None:
        if not as_json:
            sys.stderr.write(f"[diagnose] {safe_text(text)}\n")
            sys.stderr.flush()

    job = diagnose_job(targets, out, method, calls, duration, timeout, attach_timeout, say, arming)
    failed_alike = nothing_collected(job)
    code = failed_alike if failed_alike is not None else exit_code(job, fail_on)
    unarmed = [r for r in job.armed or [] if not rank_armed(r)]
    if arming and (unarmed or job.armed is None) and code == ExitCode.OK:
        code = ExitCode.COMMAND_FAILED  # a trigger asked for is not armed: nobody is watching
    if as_json:
        doc = job.to_dict()
        doc["exit_code"] = code
        sys.stdout.write(json.dumps(doc, default=str) + "\n")
        sys.stdout.flush()
    else:
        from rich.console import Console

        render(job, Console())
    if code:
        # The JSON document or the rendering above already said it: the error only ends the run.
        err = _ending(code, fail_on, job, failed_alike is not None) if code != ExitCode.COMMAND_FAILED \
            or not arming else FlightProfilerError(
                f"--arm: {len(unarmed) or len(targets)} rank(s) not fully armed: exit {code}", "",
                reported=True)
        err.exit_code = code
        if not as_json:
            from rich.console import Console

            Console(stderr=True).print(err.message, highlight=False)
        raise err


def _ending(code: int, fail_on: str | None, job: JobDiagnosis, none_collected: bool) -> FlightProfilerError:
    from flight_profiler.diagnose.outputs import verdict

    if none_collected:
        err = FlightProfilerError(f"no rank could be diagnosed (see each rank's error above): "
                                  f"exit {code}", "", reported=True)
        err.exit_code = code
        return err
    if code == ExitCode.INCOMPLETE:
        return Incomplete(
            f"{len(job.gaps())} part(s) of the evidence are missing (failed ranks or phases), so "
            f"the job diagnosis is incomplete: exit {code}", "", reported=True)
    return verdict(code, fail_on, 0)


def render(job: JobDiagnosis, console: Console) -> None:
    from flight_profiler.cli.agent_commands.base import txt
    from flight_profiler.rank_list import ranks_label
    from flight_profiler.render.report_terminal import SEVERITY_STYLE

    for r in job.stack_results:
        if not r.ok and r.error:
            console.print(f"[red]rank {r.rank} (pid {r.pid}): {txt(str(r.error.get('message')))}[/red]")
    for r in job.rank_results:
        if not r.ok and r.error:
            console.print(f"[red]rank {r.rank} (pid {r.pid}) diagnosis failed: "
                          f"{txt(str(r.error.get('message')))}[/red]")
    if job.skipped_phases:
        console.print(f"[yellow]per-rank phases skipped: {txt(job.skipped_phases)}[/yellow]")
    gaps = job.gaps()
    if gaps:
        console.print("[yellow]the evidence is incomplete:[/yellow]")
        for g in gaps[:16]:
            console.print(f"  rank {g['rank']}: {txt(str(g['phase']))} {txt(str(g['status']))}"
                          f" ({txt(str(g['reason'])[:160])}): hides {txt(str(g['hides']))}",
                          highlight=False)
    report = job.report
    if report is None:
        console.print("no report: nothing could be collected from the ranks")
        return
    if not report.findings:
        console.print("[green]no problem found on any rank[/green]")
    for f in report.findings:
        who = ranks_label(f.ranks)
        colour = SEVERITY_STYLE[f.severity]
        console.print(f"[{colour}]{f.severity}[/{colour}] [bold]{txt(f.rule)}[/bold]"
                      f"{txt(' [' + who + ']') if who else ''}: {txt(f.title)}", highlight=False)
        console.print(f"  {txt(f.summary)}", highlight=False)
        for w in f.where[:4]:
            console.print(f"  at {txt(w)}", highlight=False)
    for fmt, path in job.outputs.items():
        console.print(f"{fmt}: {txt(path)}", highlight=False)
    for r in job.armed or []:
        if r.ok and r.result is not None:
            for a in r.result["armed"]:
                state = "armed" if a["armed"] else f"[red]not armed[/red] ({txt(str(a['error']))})"
                console.print(f"rank {r.rank} (pid {r.pid}): {state}: {txt(a['line'])}", highlight=False)
        else:
            console.print(f"[red]rank {r.rank} (pid {r.pid}): not armed: "
                          f"{txt(str((r.error or {}).get('message')))}[/red]", highlight=False)
    console.print(f"done in {job.seconds:.1f} s", highlight=False)
