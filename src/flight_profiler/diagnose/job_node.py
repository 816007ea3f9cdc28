"""The per-node step of ``job srun``: find the SLURM job's ranks on this node, diagnose them.

How the step finds its pid (``--job-pid auto``): srun starts it inside the job's allocation on
one node, with SLURM_JOB_ID and SLURMD_NODENAME in its environment. The ranks of the job on this
node are the processes of the rank scan (``attach.ranks.scan``: torchrun launchers and processes
with a RANK) whose own environment has the same SLURM_JOB_ID, and, when the step knows its node
name, the same SLURMD_NODENAME (two slurmd on one host, as in the tests, see each other's
processes). They must make one job (one torchrun, or ranks started by srun itself with one
MASTER_ADDR:MASTER_PORT); two jobs under one SLURM job (two torchruns in one allocation) are
refused, naming both, since the user must say which one (``--job-pid PID``). The step then runs
``diagnose RANKPID --all-ranks --ranks <this node's ranks>``: the rank scan groups ranks by
run id and master, which would pull another node's ranks in when two nodes share a host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from flight_profiler.attach.ranks import Job, ProcInfo, format_ranks, group_jobs, scan
from flight_profiler.errors import ProcessNotFound, UsageError

# Seconds diagnose has to end once stopped. Interrupted during the per-rank workflow,
# diagnose --all-ranks waits for the ranks' phases in flight (each up to its --timeout) before
# it detaches: measured up to ~40 s on this loaded 2-core machine with --timeout 20.
DETACH_GRACE = 90.0


@dataclass
class NodeTarget:
    pid: int  # the lowest rank's on this node
    ranks: list[int]


def _slurm_env(pid: int) -> dict[str, str]:
    import psutil  # type: ignore[import-untyped]

    try:
        env: dict[str, str] = psutil.Process(pid).environ()
    except Exception:  # psutil.Error: gone, or another user's without root
        return {}
    return {k: env[k] for k in ("SLURM_JOB_ID", "SLURMD_NODENAME") if k in env}


def pick_target(jobid: str, node: str | None, procs: list[ProcInfo],
                envs: dict[int, dict[str, str]]) -> NodeTarget:
    """The job's ranks among ``procs`` (pure: ``envs`` maps pid -> its SLURM variables)."""
    def ours(p: ProcInfo) -> bool:
        env = envs.get(p.pid, {})
        return env.get("SLURM_JOB_ID") == jobid and (node is None
                                                     or env.get("SLURMD_NODENAME") == node)

    mine = [p for p in procs if ours(p)]
    jobs: list[Job] = [j for j in group_jobs(mine) if j.ranks]
    where = f"node {node}" if node else "this node"
    if not jobs:
        raise ProcessNotFound(
            f"no rank of SLURM job {jobid} on {where} (no torchrun launcher or process with "
            "RANK whose environment has this SLURM_JOB_ID)",
            "check that the job runs ranks on every node of its allocation (`squeue -j "
            f"{jobid}`), or pass --job-pid PID")
    if len(jobs) > 1:
        names = "; ".join(f"pid {j.launcher_pid or j.ranks[0].pid} (ranks "
                          f"{format_ranks([r.rank for r in j.ranks if r.rank is not None])})"
                          for j in jobs)
        raise UsageError(f"SLURM job {jobid} runs {len(jobs)} distributed jobs on {where}: "
                         f"{names}", "pick one with --job-pid PID")
    job = jobs[0]
    ranks = sorted(r.rank for r in job.ranks if r.rank is not None)
    # A rank's pid, not the launcher's: diagnose finds the job from it even where the rank
    # scan sees another node's torchrun first (two slurmd on one host).
    return NodeTarget(job.ranks[0].pid, ranks)


def find_target(jobid: str) -> NodeTarget:
    """This node's ranks of SLURM job ``jobid`` (live processes)."""
    procs = scan(include_all=True, ranks_only=True)
    envs = {p.pid: _slurm_env(p.pid) for p in procs}
    return pick_target(jobid, os.environ.get("SLURMD_NODENAME") or None, procs, envs)


def diagnose_argv(pid: int, ranks: list[int], out_dir: str, diagnose_args: list[str],
                  python: str = sys.executable) -> list[str]:
    """``diagnose PID --all-ranks --ranks R --out DIR ARGS``: ARGS are the user's options."""
    return [python, "-m", "flight_profiler", "diagnose", str(pid), "--all-ranks",
            "--ranks", format_ranks(ranks), "--out", out_dir, *diagnose_args]


def run_diagnose(argv: list[str], log_path: str | None) -> int:
    """Run diagnose; its stdout (the report text) goes to ``log_path`` when stdout carries the
    archive, its progress to stderr as always (srun passes it through).

    Stopping (``job srun`` at --timeout or Ctrl-C) sends SIGUSR1 through srun to every process
    of the step; this step turns it (or a SIGTERM) into the one SIGINT that makes diagnose
    detach its agents from the ranks and end, and waits for that (subprocess.call would SIGKILL
    it). diagnose starts with SIGUSR1 and SIGTERM ignored (inherited through exec): killed by
    either in the middle of its detach, an agent stayed in a rank (the integration test saw it).
    A SIGINT (a user's Ctrl-C on their own srun) reaches diagnose itself: not sent twice."""
    log = None
    if log_path is not None:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        log = os.fdopen(fd, "wb")
    # A task may start with SIGINT ignored; diagnose's detach on Ctrl-C needs it delivered
    # (a Python handler here is SIG_DFL after exec, where Python installs its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOPS}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log)
        for sig in _STOPS:
            signal.signal(sig, _interrupt)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            for sig in _STOPS:
                signal.signal(sig, signal.SIG_IGN)  # one stop is enough
            if _stopped:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
            try:
                return proc.wait(DETACH_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if log is not None:
            log.close()


_STOPS = (signal.SIGUSR1, signal.SIGTERM)
_stopped: list[int] = []


def _interrupt(sig: int, _frame: object) -> None:
    _stopped.append(sig)
    raise KeyboardInterrupt


def node_name() -> str:
    name = os.environ.get("SLURMD_NODENAME")
    if not name:
        with contextlib.suppress(OSError):
            name = os.uname().nodename.split(".")[0]
    return name or "node"
