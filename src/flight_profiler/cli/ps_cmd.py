"""`flight_profiler ps`: the Python processes one may attach to, ranks grouped by job."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from flight_profiler.attach.ranks import Job, ProcInfo
from flight_profiler.safe_text import safe_markup, safe_text


def _in_jobs(jobs: list[Job]) -> set[int | None]:
    return ({r.pid for j in jobs for r in j.ranks} | {w.pid for j in jobs for w in j.workers}
            | {j.launcher_pid for j in jobs})


def ps_document(procs: list[ProcInfo], jobs: list[Job]) -> dict[str, Any]:
    in_job = _in_jobs(jobs)
    return {"jobs": [j.to_dict() for j in jobs],
            "processes": [p.to_dict() for p in procs if p.pid not in in_job]}


def _cmd(p: ProcInfo, width: int = 70, by_pid: dict[int, ProcInfo] | None = None) -> str:
    """The command line, cut to ``width``: its user chose it (escape sequences included). A
    spawned child's own (``python -c 'from multiprocessing.spawn import spawn_main...'``) says
    nothing: its parent's is shown."""
    parent = (by_pid or {}).get(p.ppid) if p.spawned else None
    line = " ".join(p.cmdline) if parent is None else f"(spawned by {parent.pid}) {' '.join(parent.cmdline)}"
    text = safe_text(line, None)
    return safe_markup(text if len(text) <= width else text[: width - 1] + "…", None)


def _render(procs: list[ProcInfo], jobs: list[Job]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    by_pid = {p.pid: p for p in procs}
    for job in jobs:
        launcher = by_pid.get(job.launcher_pid) if job.launcher_pid else None
        title = (f"job {safe_markup(job.key, 200)}: {len(job.ranks)} local rank(s) of world size "
                 f"{job.world_size if job.world_size is not None else '?'}")
        if job.key.startswith("spawn:"):
            title += (f", started by torch.multiprocessing.spawn from pid {job.launcher_pid} "
                      "(ranks numbered in the order they started)")
        elif launcher is not None:
            title += f", torchrun pid {launcher.pid}"
        table = Table(title=title, title_justify="left")
        for col in ("RANK", "LOCAL", "PID", "USER", "PYTHON", "TORCH", "COMMAND"):
            table.add_column(col)
        for r in job.ranks:
            table.add_row(str(r.rank), str(r.local_rank), str(r.pid), safe_markup(r.user, 64),
                          safe_markup(r.python or "?", 40),
                          "yes" if r.torch else "no", _cmd(r, by_pid=by_pid))
        console.print(table)
        if job.workers:
            pids = ", ".join(f"{w.pid} (rank {w.rank})" for w in job.workers)
            console.print(f"  worker processes of the ranks (DataLoader...): {pids}", highlight=False)
    in_job = _in_jobs(jobs)
    others = [p for p in procs if p.pid not in in_job]
    if others:
        table = Table(title="other Python processes", title_justify="left")
        for col in ("PID", "USER", "PYTHON", "TORCH", "COMMAND"):
            table.add_column(col)
        for p in others:
            table.add_row(str(p.pid), safe_markup(p.user, 64), safe_markup(p.python or "?", 40),
                          "yes" if p.torch else "no", _cmd(p, by_pid=by_pid))
        console.print(table)
    if not procs:
        console.print("no Python process that this user may attach to")


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: jobs, then the others.")
@click.option("-a", "--all-users", is_flag=True, help="Other users' processes too (as root).")
def ps(as_json: bool, all_users: bool) -> None:
    """List the Python processes to attach to; torchrun (and torch.multiprocessing.spawn) jobs
    grouped by job, ranks in order.

    \b
    Then: flight_profiler PID --all-ranks --cmd stack   (PID: the launcher or a rank)
    """
    from flight_profiler.attach.ranks import group_jobs, scan

    procs = scan(include_all=all_users)
    jobs = group_jobs(procs)
    if as_json:
        sys.stdout.write(json.dumps(ps_document(procs, jobs)) + "\n")
    else:
        _render(procs, jobs)
