"""A 2-"node" torchrun job on one machine, for the multi-node tests and bench: two launchers
(``--nnodes 2``) of one job, each starting its node's ranks, as on two machines. Each launcher
has its own session, so one signal stops a node.

Rendezvous: ``static`` (``--node-rank K --master-addr``: the node ranks are the launch order) or
``c10d`` (``--rdzv-backend c10d --rdzv-endpoint``, as elastic jobs and most clusters run: the
rendezvous hands out the node ranks, in whichever order the launchers join, so a node's rank is
read from its ranks' global ranks once they are up).
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

from torchrun_jobs import DDP_TRAINER, Job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NodeJob(Job):
    """One node's launcher of a multi-node job: ``Job`` with the multi-node launcher arguments."""

    def __init__(self, mode: str, node: int, nnodes: int, per_node: int, port: int,
                 directory: Path, env: dict[str, str] | None = None,
                 rendezvous: str = "static") -> None:
        self.node = node
        self.per_node = per_node
        self._launch = ["-m", "torch.distributed.run", "--nnodes", str(nnodes),
                        "--nproc-per-node", str(per_node)]
        if rendezvous == "c10d":
            self._launch += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                             "--rdzv-id", f"fp-test-{port}"]
        else:
            self._launch += ["--node-rank", str(node), "--master-addr", "127.0.0.1",
                             "--master-port", str(port)]
        super().__init__(DDP_TRAINER, f"{mode}-node{node}", per_node, directory, env)

    def wait_ready(self, timeout: float = 180.0) -> dict[int, int]:
        pids = super().wait_ready(timeout)
        self.node = min(pids) // self.per_node  # what the rendezvous gave this launcher
        return pids

    def command(self, python: str, workload: Path, mode: str) -> list[str]:
        return [python, *self._launch, str(workload), mode.rsplit("-node", 1)[0], str(self.ready)]


def start_nodes(mode: str, directory: Path, nnodes: int = 2, per_node: int = 2,
                env: dict[str, str] | None = None, rendezvous: str = "static") -> list[NodeJob]:
    port = free_port()
    return [NodeJob(mode, k, nnodes, per_node, port, directory, {**(env or {})}, rendezvous)
            for k in range(nnodes)]



def diagnose_nodes(cli: list[str], nodes: list[NodeJob], out: Path, duration: str = "1.5",
                   timeout: float = 400) -> dict[int, tuple[int, dict[str, Any]]]:
    """``diagnose LAUNCHER --all-ranks --out OUT/nodeK`` on every node at once, as a scheduler
    runs the per-node step on every machine; per node: (exit status, its JSON document)."""
    procs = {n.node: subprocess.Popen(
        [*cli, "diagnose", str(n.launcher), "--all-ranks", "--out", str(out / f"node{n.node}"),
         "--duration", duration, "--timeout", "20", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in nodes}
    done: dict[int, tuple[int, dict[str, Any]]] = {}
    for node, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        try:
            done[node] = (proc.returncode, json.loads(stdout or "{}"))
        except ValueError:
            raise AssertionError(f"node {node}: {stdout[-2000:]} {stderr[-2000:]}") from None
    return done


def merged_report(cli: list[str], *dirs: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([*cli, "report", "--json", *map(str, dirs)], capture_output=True,
                          text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr
