"""`flight_profiler job srun JOBID -- diagnose --all-ranks ...`: every node of a SLURM job.

``job node`` is the step srun runs on each node (docs/ranks.md, "Multi-node"); users call
``job srun``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time

import click

from flight_profiler.cli.params import FiniteFloatRange
from flight_profiler.errors import ExitCode, FindingsThreshold, Incomplete, UsageError
from flight_profiler.report.models import SEVERITIES
from flight_profiler.safe_text import safe_text

# Options of diagnose that the job command sets itself on every node.
_OWNED = {"--out": "the job command writes each node into --out DIR/<node>",
          "--arm": "arm the ranks of each node with `flight_profiler PID --all-ranks --cmd arm`",
          "--json": "pass --json to `job srun` itself"}


def diagnose_args(rest: tuple[str, ...]) -> list[str]:
    """The user's words after ``--``: ``diagnose [--all-ranks] [options] [module [class] method]``,
    returned without ``diagnose`` and ``--all-ranks`` (each node's step adds them)."""
    if not rest or rest[0] != "diagnose":
        raise UsageError("job srun runs diagnose on every node: "
                         "`job srun JOBID -- diagnose --all-ranks [options]`",
                         "put `-- diagnose --all-ranks` after the job's options")
    args = [a for a in rest[1:] if a != "--all-ranks"]
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in _OWNED:
            raise UsageError(f"diagnose's {name} cannot be given after `--` here",
                             _OWNED[name])
    return args


@click.group("job", context_settings={"help_option_names": ["-h", "--help"]})
def job() -> None:
    """Diagnose every node of a distributed job through its launcher (SLURM srun)."""


@job.command("srun", epilog=(
    "Examples:\n\n"
    "  flight_profiler job srun 12345 --out /shared/diag -- diagnose --all-ranks\n\n"
    "  flight_profiler job srun 12345 -- diagnose --all-ranks train train_step --calls 5\n\n"
    "Exit codes: 0 every node diagnosed, 12 some nodes missing (the report names them) or "
    "a node's diagnosis incomplete, 9 a "
    "finding reached --fail-on, 3 the job is not running, 1 srun missing. docs/ranks.md."))
@click.argument("jobid")
@click.argument("rest", nargs=-1, type=click.UNPROCESSED)
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory of the job's results: DIR/<node> per node, the report in DIR "
                   "[default: ./flight_profiler-slurm-JOBID-YYYYmmdd-HHMMSS].")
@click.option("--shared", is_flag=True,
              help="DIR is on a filesystem every node sees: each node writes DIR/<node> itself "
                   "(default: each node streams its results back on srun's stdout).")
@click.option("--timeout", type=FiniteFloatRange(5, 86400), default=1800.0, show_default=True,
              help="Seconds for the whole job: a node still running then is stopped and missing.")
@click.option("--fanout", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Nodes diagnosed at once (one srun each).")
@click.option("--job-pid", default="auto", show_default=True, metavar="auto|PID",
              help="The pid diagnose starts from on each node; auto: the job's torchrun or ranks "
                   "there (found by their SLURM_JOB_ID).")
@click.option("--remote", metavar="COMMAND", default=None,
              help="flight_profiler as the nodes run it [default: this Python -m flight_profiler].")
@click.option("--fail-on", type=click.Choice(SEVERITIES), default=None,
              help="Exit with code 9 when the job report has a finding this severe.")
@click.option("--json", "as_json", is_flag=True, help="Print job_srun.json's document.")
def srun(jobid: str, rest: tuple[str, ...], out_dir: str | None, shared: bool, timeout: float,
         fanout: int, job_pid: str, remote: str | None, fail_on: str | None,
         as_json: bool) -> None:
    """Run `diagnose --all-ranks` on every node of running SLURM job JOBID, one report."""
    from flight_profiler.diagnose.srun import merge_report, run_job, write_job_json
    from flight_profiler.render.formats import write_report

    args = diagnose_args(rest)
    if job_pid != "auto" and not job_pid.isdigit():
        raise UsageError(f"--job-pid {job_pid!r} is neither auto nor a pid", "e.g. --job-pid auto")
    out = out_dir or f"flight_profiler-slurm-{jobid}-{time.strftime('%Y%m%d-%H%M%S')}"

    def say(text: str) -> None:
        if not as_json:
            sys.stderr.write(f"[job] {safe_text(text)}\n")
            sys.stderr.flush()

    run = run_job(jobid, out, args, shared=shared, timeout=timeout, fanout=fanout,
                  remote=shlex.split(remote) if remote else None, job_pid=job_pid, progress=say)
    write_job_json(run)
    report = merge_report(run)
    for fmt in ("md", "json", "html"):
        write_report(report, os.path.join(run.out_dir, f"report.{fmt}"), fmt)
    ok = [n.node for n in run.nodes if n.ok]
    if as_json:
        sys.stdout.write(json.dumps(run.to_dict(), indent=2) + "\n")
    else:
        from flight_profiler.render.report_terminal import print_report

        print_report(report)
        say(f"{len(ok)} of {len(run.nodes)} node(s) diagnosed; report in {run.out_dir}")
    if run.missing:
        raise Incomplete(f"node(s) {', '.join(run.missing)} missing from the job report "
                         f"(job_srun.json says why)", "", reported=as_json)
    partial = [n.node for n in run.nodes if n.ok and n.exit_code == ExitCode.INCOMPLETE]
    if partial:
        raise Incomplete(f"the diagnosis of node(s) {', '.join(partial)} is incomplete (their "
                         "diagnose_job.json says which evidence is missing)", "",
                         reported=as_json)
    if fail_on and report.reaches(fail_on):
        raise FindingsThreshold(f"findings reached --fail-on {fail_on}: exit {ExitCode.FINDINGS}",
                                "", reported=as_json)


@job.command("node", hidden=True)
@click.argument("jobid")
@click.argument("rest", nargs=-1, type=click.UNPROCESSED)
@click.option("--out", "out_dir", type=click.Path(file_okay=False))
@click.option("--stream", is_flag=True)
@click.option("--job-pid", default="auto")
def node(jobid: str, rest: tuple[str, ...], out_dir: str | None, stream: bool,
         job_pid: str) -> None:
    """The step `job srun` runs on each node (inside the job's allocation)."""
    from flight_profiler.diagnose.job_node import (
        diagnose_argv,
        find_target,
        node_name,
        run_diagnose,
    )
    from flight_profiler.diagnose.node_archive import pack

    if (out_dir is None) == (not stream):
        raise UsageError("job node takes --out DIR or --stream", "it is started by `job srun`")
    args = list(rest)
    if job_pid == "auto":
        target = find_target(jobid)
        pid, ranks = target.pid, target.ranks
        args = _intersect_ranks(args, ranks)
    else:
        pid, ranks = int(job_pid), []
    if not stream:
        assert out_dir is not None
        argv = diagnose_argv(pid, ranks, out_dir, args) if ranks else _no_ranks(pid, out_dir, args)
        sys.exit(run_diagnose(argv, None))
    with tempfile.TemporaryDirectory(prefix="fp-node-") as tmp:
        work = os.path.join(tmp, "out")
        argv = diagnose_argv(pid, ranks, work, args) if ranks else _no_ranks(pid, work, args)
        os.mkdir(work, 0o755)
        code = run_diagnose(argv, os.path.join(tmp, "diagnose.stdout"))
        os.replace(os.path.join(tmp, "diagnose.stdout"), os.path.join(work, "diagnose.stdout"))
        pack(work, sys.stdout, node_name(), code)


def _no_ranks(pid: int, out_dir: str, args: list[str]) -> list[str]:
    # --job-pid PID: diagnose finds that pid's ranks itself.
    return [sys.executable, "-m", "flight_profiler", "diagnose", str(pid), "--all-ranks",
            "--out", out_dir, *args]


def _intersect_ranks(args: list[str], here: list[int]) -> list[str]:
    """The user's --ranks LIST keeps the ranks of it that are on this node (here)."""
    from flight_profiler.rank_list import parse_ranks

    if "--ranks" not in args:
        return args
    i = args.index("--ranks")
    if i + 1 >= len(args):
        raise UsageError("--ranks needs a LIST", "e.g. --ranks 0,3-5")
    wanted = set(parse_ranks(args[i + 1]))
    keep = sorted(wanted & set(here))
    if not keep:
        raise UsageError(f"none of ranks {args[i + 1]} is on this node", "")
    here[:] = keep
    return args[:i] + args[i + 2:]
