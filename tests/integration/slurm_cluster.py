"""A real SLURM cluster of two nodes on this host, for `job srun`'s tests.

munged with its own key and socket, slurmctld, and two slurmd (`slurmd -N n1`, `-N n2`: Debian's
slurm-wlm 22.05 is built with multiple-slurmd support) on 127.0.0.1 with their own ports, all in
a temporary directory, all started here (their pids kept) and stopped here. SLURM_CONF points
the client commands (sbatch, srun, squeue) at it. Skips, saying why, when SLURM is not
installed (`apt-get install -y slurm-wlm munge`) or not root, or the daemons do not start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NODES = ("n1", "n2")
_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo")


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _conf(root: Path, ports: list[int]) -> str:
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=fptest", f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge", f"AuthInfo=socket={root}/munge/sock", "CredType=cred/munge",
        "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n", f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid", f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "SwitchType=switch/none", "MpiDefault=none",
        "ReturnToService=2", "SchedulerType=sched/builtin", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "MailProg=/bin/true",
    ]
    cpus = os.cpu_count() or 1
    for name, port in zip(NODES, ports[2:]):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={cpus} RealMemory=1000 State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
                 "State=UP OverSubscribe=YES")
    return "\n".join(lines) + "\n"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in reversed(procs):
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start(root: Path) -> Iterator[Cluster]:
    """Start the cluster under ``root``; yields it; stops every daemon it started."""
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"SLURM not installed ({', '.join(missing)} missing): "
                    "apt-get install -y slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the test SLURM cluster runs its daemons as root")
    for sub in ("munge", "state", "log", "run", *(f"spool/{n}" for n in NODES)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    (root / "munge").chmod(0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, _free_ports(2 + len(NODES))))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen[bytes]] = []

    def daemon(*argv: str, log: str) -> None:
        with open(root / "log" / log, "wb") as out:
            procs.append(subprocess.Popen(list(argv), env=env, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    cluster = Cluster(root, env)
    try:
        m = root / "munge"
        daemon("munged", "-F", "--force", f"--key-file={key}", f"--socket={m}/sock",
               f"--log-file={m}/log", f"--pid-file={m}/pid", f"--seed-file={m}/seed",
               log="munged.out")
        _wait(lambda: (m / "sock").exists(), 10, "munged did not create its socket", root)
        daemon("slurmctld", "-D", "-i", log="slurmctld.out")
        time.sleep(1)
        for name in NODES:
            daemon("slurmd", "-D", "-N", name, log=f"slurmd-{name}.out")
        _wait(lambda: _idle(cluster), 60, "the two slurmd nodes did not become idle", root)
        yield cluster
    finally:
        _drain(cluster)
        _stop(procs)


def _drain(cluster: Cluster) -> None:
    """Cancel this cluster's jobs (SLURM_CONF is ours: no other cluster's) and wait for them to
    end: slurmstepd outlives a stopped slurmd, and so would the job's processes."""
    try:
        cluster.run("scancel", "--full", "--user", str(os.geteuid()), timeout=20)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not cluster.run("squeue", "-h", "-o", "%i", timeout=10).stdout.strip():
                return
            time.sleep(0.5)
    except subprocess.TimeoutExpired:
        pass


def _idle(cluster: Cluster) -> bool:
    try:
        done = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
    except subprocess.TimeoutExpired:
        return False
    states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
    return all(states.get(n) == "idle" for n in NODES)


def _wait(ready: object, seconds: float, why: str, root: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted((root / "log").glob("*.out")))
    pytest.skip(f"SLURM could not start here: {why}\n{logs}")
