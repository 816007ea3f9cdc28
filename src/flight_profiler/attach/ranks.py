"""Find Python processes and the ranks of distributed jobs (torchrun / elastic agent), with psutil.

A torchrun job on one node is an elastic agent (``python -m torch.distributed.run`` or
``torchrun``) whose children are the ranks; each rank's environment carries RANK, LOCAL_RANK,
WORLD_SIZE, TORCHELASTIC_RUN_ID and MASTER_ADDR/PORT. Ranks are grouped into a job by
(run id, master address, master port), so that ranks started by other launchers (SLURM srun,
mpirun, a hand-made script) are grouped as well.

A job started by ``torch.multiprocessing.spawn`` (the PyTorch DDP tutorial's way) has no RANK in
any environment: its ranks are the script's children that run ``spawn_main`` and share a TCP
port (the process group's store, or each other's gloo/NCCL sockets), which tells them from
spawned DataLoader workers. spawn starts rank 0 first, then 1...: they are numbered in the order
they started (their pids), and say so (``rank_by``).

The pure functions (``group_jobs``, ``job_of``, ``select_ranks``) take plain records, so
they are unit-tested without live processes.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from flight_profiler.attach.process import python_version_from
from flight_profiler.errors import ProcessNotFound, UsageError
from flight_profiler.rank_list import format_ranks, parse_ranks

__all__ = ["Job", "ProcInfo", "format_ranks", "group_jobs", "identity", "job_of", "one_node",
           "parse_ranks", "scan", "select_ranks"]

_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_NODEID")
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_PYTHON_NAME = re.compile(r"python", re.IGNORECASE)


@dataclass
class ProcInfo:
    """What a user needs to pick a process, and what groups ranks into jobs."""

    pid: int
    ppid: int
    user: str
    cmdline: list[str]
    python: str | None  # "3.11", None when not recognised
    torch: bool  # libtorch is mapped: torch is imported
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    run_id: str | None = None
    master: str | None = None  # "addr:port"
    launcher: bool = False  # a torchrun / elastic agent process
    launcher_pid: int | None = None  # the rank's torchrun parent, if any
    worker_of: int | None = None  # a DataLoader / multiprocessing child of this rank's pid
    # Which node of the job the rank runs on: GROUP_RANK (torchrun), else SLURM_NODEID, else
    # derived from RANK and LOCAL_WORLD_SIZE (torchrun numbers ranks node by node).
    node_rank: int | None = None
    local_world_size: int | None = None
    slurm_job_id: str | None = None
    spawned: bool = False  # started by multiprocessing's spawn (``spawn_main``)
    tcp_ports: list[int] = field(default_factory=list)  # a spawned child's: remote and listening
    rank_by: str = "environment"  # or "start order": a spawned rank, numbered by its pid

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Job:
    """The ranks of one distributed job that live on this node."""

    key: str
    launcher_pid: int | None
    world_size: int | None
    ranks: list[ProcInfo] = field(default_factory=list)
    # Children of ranks that inherited their environment (DataLoader workers): not ranks.
    workers: list[ProcInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "launcher_pid": self.launcher_pid, "world_size": self.world_size,
                "ranks": [r.to_dict() for r in self.ranks],
                "workers": [w.to_dict() for w in self.workers]}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def from_environ(info: ProcInfo, env: dict[str, str]) -> ProcInfo:
    """Fill the distributed fields of ``info`` from a process environment."""
    info.rank = _int(env.get("RANK"))
    info.local_rank = _int(env.get("LOCAL_RANK"))
    info.world_size = _int(env.get("WORLD_SIZE"))
    info.run_id = env.get("TORCHELASTIC_RUN_ID")
    if env.get("MASTER_ADDR") or env.get("MASTER_PORT"):
        info.master = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    info.local_world_size = _int(env.get("LOCAL_WORLD_SIZE"))
    info.slurm_job_id = env.get("SLURM_JOB_ID") or None
    info.node_rank = _int(env.get("GROUP_RANK"))
    if info.node_rank is None:
        info.node_rank = _int(env.get("SLURM_NODEID"))
    if (info.node_rank is None and info.rank is not None and info.local_world_size
            and info.local_world_size > 0):
        info.node_rank = info.rank // info.local_world_size
    return info


def identity(ranks: list[ProcInfo]) -> dict[str, Any]:
    """The job these ranks belong to, as written into diagnose_job.json and the stack files:
    what lets per-node outputs merge without guessing (report/job_merge.py). The hostname is
    this machine's, shown to the reader and never used to tell ranks apart (two simulated
    nodes on one machine share it)."""
    import socket

    first = ranks[0] if ranks else None
    nodes = sorted({r.node_rank for r in ranks if r.node_rank is not None})
    return {"run_id": first.run_id if first else None, "master": first.master if first else None,
            "slurm_job_id": first.slurm_job_id if first else None,
            "world_size": first.world_size if first else None,
            "node_rank": nodes[0] if len(nodes) == 1 else None, "hostname": socket.gethostname()}


def is_launcher(cmdline: list[str]) -> bool:
    """``torchrun ...``, ``python .../torchrun ...`` or ``python -m torch.distributed.run|launch``."""
    if not cmdline:
        return False
    if any(os.path.basename(part) == "torchrun" for part in cmdline[:2]):
        return True
    return any(part == "-m" and cmdline[i + 1] in _LAUNCHER_MODULES
               for i, part in enumerate(cmdline[:-1]))


def job_key(info: ProcInfo) -> str | None:
    """Ranks with the same key belong to one job; None for a process that is no rank (or a
    spawned one: their job is their parent's, _spawn_jobs)."""
    if info.rank is None or info.rank_by != "environment":
        return None
    if info.run_id is None and info.master is None:
        return f"launcher:{info.launcher_pid}" if info.launcher_pid else None
    return f"{info.run_id or '-'}@{info.master or '-'}"


def mark_workers(procs: list[ProcInfo]) -> None:
    """A DataLoader worker (or any multiprocessing child) inherits its rank's environment, RANK
    included: a process whose parent has the same rank in the same job is that rank's worker."""
    by_pid = {p.pid: p for p in procs}
    for p in procs:
        parent = by_pid.get(p.ppid) if p.ppid != p.pid else None
        if (p.rank is not None and parent is not None and parent.rank == p.rank
                and (parent.run_id, parent.master) == (p.run_id, p.master)):
            p.worker_of = parent.pid
            p.launcher_pid = parent.launcher_pid


def is_spawned(cmdline: list[str]) -> bool:
    """A child started by multiprocessing's spawn: ``python -c 'from multiprocessing.spawn
    import spawn_main; spawn_main(...)' --multiprocessing-fork``."""
    return any("spawn_main" in part for part in cmdline[:4]) and "--multiprocessing-fork" in cmdline


def _spawn_jobs(procs: list[ProcInfo], taken: set[int]) -> list[Job]:
    """Jobs of ranks started by torch.multiprocessing.spawn: per parent, its spawned children
    (with torch) that all use one TCP port; numbered in the order they started. A spawned
    child of such a rank (a DataLoader worker) is that rank's worker."""
    by_parent: dict[int, list[ProcInfo]] = {}
    for p in procs:
        if (p.spawned and p.torch and (p.rank is None or p.rank_by == "start order")
                and p.pid not in taken):
            by_parent.setdefault(p.ppid, []).append(p)
    jobs = []
    for parent, kids in sorted(by_parent.items()):
        shared = set.intersection(*(set(k.tcp_ports) for k in kids)) if len(kids) >= 2 else set()
        if not shared:
            continue
        kids.sort(key=lambda k: k.pid)
        for index, kid in enumerate(kids):
            kid.rank = kid.local_rank = index
            kid.world_size = len(kids)
            kid.launcher_pid = parent
            kid.rank_by = "start order"
        ranks = {k.pid for k in kids}
        workers = [p for p in procs if p.ppid in ranks and p.rank is None]
        for w in workers:
            w.worker_of = w.ppid
        jobs.append(Job(f"spawn:{parent}", parent, len(kids), kids, workers))
    return jobs


def group_jobs(procs: list[ProcInfo]) -> list[Job]:
    """Group the ranks into jobs, each ordered by rank (jobs ordered by launcher pid)."""
    mark_workers(procs)
    jobs: dict[str, Job] = {}
    for p in procs:
        key = job_key(p)
        if key is None:
            continue
        job = jobs.get(key)
        if job is None:
            job = jobs[key] = Job(key, p.launcher_pid, p.world_size)
        if p.worker_of is not None:
            job.workers.append(p)
            continue
        job.ranks.append(p)
        if job.launcher_pid is None:
            job.launcher_pid = p.launcher_pid
    for job in jobs.values():
        job.ranks.sort(key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.pid))
    taken = {p.pid for j in jobs.values() for p in (*j.ranks, *j.workers)}
    spawned = _spawn_jobs(procs, taken)
    return sorted([*jobs.values(), *spawned], key=lambda j: (j.launcher_pid or 0, j.key))


def one_node(job: Job, launcher_pid: int | None) -> Job:
    """The part of ``job`` one launcher started: on one machine, two torchrun launchers of the
    same job (two simulated nodes, ``--nnodes 2``) share the job key, and a node is one
    launcher's children. Ranks without a launcher (srun, mpirun) stay together."""
    if launcher_pid is None:
        return job
    ranks = [r for r in job.ranks if r.launcher_pid == launcher_pid]
    keep = {r.pid for r in ranks}
    workers = [w for w in job.workers if w.worker_of in keep]
    return Job(job.key, launcher_pid, job.world_size, ranks, workers)


def job_of(pid: int, procs: list[ProcInfo]) -> Job:
    """The ranks of ``pid``'s job on its node: ``pid`` is a rank, or the launcher of the ranks
    (only that launcher's ranks: another launcher of the same job is another node)."""
    jobs = group_jobs(procs)
    for job in jobs:
        if any(p.launcher and p.pid == pid for p in procs) and any(
                r.launcher_pid == pid for r in job.ranks):
            return one_node(job, pid)
        rank = next((r for r in job.ranks if r.pid == pid), None)
        if rank is not None:
            return one_node(job, rank.launcher_pid)
        if job.launcher_pid == pid:
            return job
        if any(w.pid == pid for w in job.workers):
            raise UsageError(f"process {pid} is a DataLoader / multiprocessing worker of a rank, "
                             "not a rank", "pass the pid of the rank or of the torchrun launcher")
    if not any(p.pid == pid for p in procs) and not os.path.exists(f"/proc/{pid}"):
        raise ProcessNotFound(f"no process {pid} that this user may inspect",
                              "check the pid with `flight_profiler ps`")
    raise UsageError(f"process {pid} is neither a rank (no RANK in its environment, not a "
                     "torch.multiprocessing.spawn rank) nor the launcher of ranks",
                     "pass the pid of the torchrun launcher (or of the script that spawned the "
                     "ranks) or of any rank (`flight_profiler ps` lists them by job)")


def select_ranks(job: Job, wanted: set[int] | None) -> list[ProcInfo]:
    if wanted is None:
        return list(job.ranks)
    picked = [r for r in job.ranks if r.rank in wanted]
    missing = sorted(wanted - {r.rank for r in picked if r.rank is not None})
    if missing:
        here = ", ".join(str(r.rank) for r in job.ranks)
        raise UsageError(f"rank(s) {format_ranks(missing)} are not on this node (here: {here})",
                         "run flight_profiler on the node that hosts them, or pick among these")
    return picked


# -- live processes (psutil) ----------------------------------------------------------------

def _python_and_torch(proc: Any) -> tuple[str | None, bool]:
    # /proc/PID/maps, not psutil's memory_maps(): that one parses smaps, ~100x slower, and
    # the mapped file names are all that is needed here.
    try:
        with open(f"/proc/{proc.pid}/maps", encoding="utf-8", errors="replace") as fh:
            maps = fh.read()
        exe = proc.exe()
    except Exception:  # psutil.Error, OSError: a process that vanished or is not ours
        return None, False
    version, _ = python_version_from(exe, maps)
    return (f"{version[0]}.{version[1]}" if version else None), "libtorch" in maps


def _tcp_ports(proc: Any) -> list[int]:
    """The ports of a process's TCP sockets: remote ports of its connections, local ports it
    listens on (psutil >= 6 names the call net_connections)."""
    read = getattr(proc, "net_connections", None) or getattr(proc, "connections", None)
    ports: set[int] = set()
    try:
        for c in read(kind="tcp") if read is not None else []:
            if c.raddr:
                ports.add(int(c.raddr.port))
            elif c.status == "LISTEN" and c.laddr:
                ports.add(int(c.laddr.port))
    except Exception:  # psutil.Error: a process that vanished or is not ours
        return []
    return sorted(ports)[:256]


def scan(include_all: bool = False, ranks_only: bool = False) -> list[ProcInfo]:
    """Python processes this user may inspect (all users' with ``include_all``), launchers
    and ranks included; the calling process left out. ``ranks_only``: just launchers,
    processes with a RANK and spawned children (a torch.multiprocessing.spawn job's ranks,
    and their parent), without reading the others' memory maps (what --all-ranks needs)."""
    import psutil  # type: ignore[import-untyped]

    me = os.getpid()
    uid = os.geteuid()
    out: list[ProcInfo] = []
    spawners: list[ProcInfo] = []
    for proc in psutil.process_iter(["pid", "ppid", "username", "cmdline", "name", "uids"]):
        info = proc.info
        if info["pid"] == me or not info.get("cmdline"):
            continue
        if not include_all and uid != 0 and info["uids"] is not None and info["uids"].effective != uid:
            continue
        cmdline = list(info["cmdline"])
        if not (_PYTHON_NAME.search(info.get("name") or "") or _PYTHON_NAME.search(cmdline[0])
                or is_launcher(cmdline)):
            continue
        p = ProcInfo(pid=info["pid"], ppid=info["ppid"] or 0, user=info["username"] or "?",
                     cmdline=cmdline, python=None, torch=False, launcher=is_launcher(cmdline),
                     spawned=is_spawned(cmdline))
        # psutil.AccessDenied on another user's process: listed, without rank facts.
        with contextlib.suppress(Exception):
            from_environ(p, proc.environ())
        if ranks_only and p.rank is None and not p.launcher and not p.spawned:
            spawners.append(p)  # kept aside: the parent of spawned ranks names their job
            continue
        if not ranks_only or p.spawned:
            p.python, p.torch = _python_and_torch(proc)
            if p.python is None:
                continue
        if p.spawned and p.rank is None and p.torch:
            p.tcp_ports = _tcp_ports(proc)
        out.append(p)
    parents = {p.ppid for p in out if p.spawned}
    out.extend(p for p in spawners if p.pid in parents)
    launchers = {p.pid for p in out if p.launcher}
    for p in out:
        if p.rank is not None and p.ppid in launchers:
            p.launcher_pid = p.ppid
    return out
