"""A multi-node job on one machine: two torchrun launchers (``--nnodes 2 --node-rank 0/1``,
static rendezvous, gloo) of the DDP trainer, 2 ranks each, as on two machines. Per node,
``diagnose LAUNCHER --all-ranks --out OUT/nodeK`` (both at once, as a scheduler runs them), then
``report OUT`` (the PARENT form) and ``report OUT/node0 OUT/node1``: one verdict naming the
global rank and its node. Each node's run must see its own launcher's ranks only.

One run of each case here (CI); bench/bench_nodes.py --repeat 3 runs each three times and
measures the cost against one node.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.agent import protocol
from support import torch_available
from torchrun_nodes import NodeJob, diagnose_nodes, merged_report, start_nodes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_available(), reason="torchrun jobs need torch"),
]

CLI = [sys.executable, "-m", "flight_profiler"]
ALL_JOBS = pytest.mark.skipif(not os.environ.get("FP_ALL_JOBS"),
                              reason="the whole per-rank workflow on 4 ranks: FP_ALL_JOBS=1")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Any]:
    started: list[NodeJob] = []

    def start(mode: str, env: dict[str, str] | None = None,
              rendezvous: str = "static") -> list[NodeJob]:
        jobs = start_nodes(mode, tmp_path, env={"TORCH_FR_BUFFER_SIZE": "2000", **(env or {})},
                           rendezvous=rendezvous)
        started.extend(jobs)
        for job in jobs:
            job.wait_ready()
        time.sleep(1.5)  # past step 6, where the planted problem starts
        return jobs

    yield start
    for job in started:
        job.stop()


def check_nodes(jobs: list[NodeJob], diag: dict[int, tuple[int, dict[str, Any]]]) -> None:
    """Each node's run diagnosed its launcher's ranks and nothing else, and recorded who they are."""
    for job in jobs:
        code, doc = diag[job.node]
        assert code in (0, 12), doc
        assert sorted(int(r) for r in doc["ranks"]) == sorted(job.pids), doc["ranks"]
        assert doc["job"]["node_rank"] == job.node and doc["job"]["world_size"] == 4
        # static: the --master-addr given; c10d: the address torchrun's agents agreed on
        assert doc["job"]["master"].rsplit(":", 1)[0] in ("127.0.0.1", "localhost",
                                                          socket.gethostname())
        assert doc["job"]["master"] == diag[jobs[0].node][1]["job"]["master"]
        for rank, entry in doc["ranks"].items():
            assert (entry["rank"], entry["node_rank"], entry["pid"]) == (int(rank), job.node,
                                                                        job.pids[int(rank)])


def check_alive_and_clean(jobs: list[NodeJob]) -> None:
    for job in jobs:
        assert not job.dead_ranks(), job.log_tail()
        for rank, pid in job.pids.items():
            status = Path(f"/proc/{pid}/status").read_text()
            assert "TracerPid:\t0" in status, f"rank {rank} is still traced"
            assert not os.path.exists(protocol.socket_path(pid, os.geteuid(), "/")), rank


def verdict(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["rule"].startswith("job-") and f["severity"] != "info"]


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_a_rank_hung_on_node_1_is_named_with_its_node(nodes: Any, tmp_path: Path,
                                                      rendezvous: str) -> None:
    # c10d: the rendezvous hands out the node ranks (GROUP_RANK), not the launch order
    jobs = nodes("hang", rendezvous=rendezvous)  # rank 3 (node 1): its prefetch thread dies
    out = tmp_path / "diag"
    diag = diagnose_nodes(CLI, jobs, out)
    check_nodes(jobs, diag)
    # node 0 alone sees its ranks wait for ranks 2-3; it skips the per-rank phases (stuck)
    assert diag[0][1]["per_rank_phases_skipped"] and diag[1][1]["per_rank_phases_skipped"]
    for form in ([out], [out / "node0", out / "node1"]):
        code, doc, err = merged_report(CLI, *form)
        assert code == 0 and "warning" not in err, err
        [f] = verdict(doc)
        assert (f["rule"], f["severity"], f["ranks"]) == ("job-hang", "critical", [3])
        assert "rank 3 on node 1" in f["title"] and "ranks 0-2 wait" in f["title"], f["title"]
        assert doc["job"]["missing_ranks"] == []
    check_alive_and_clean(jobs)


@pytest.mark.skipif(not os.environ.get("FP_ALL_JOBS"),
                    reason="the whole per-rank workflow on 4 ranks (about a minute): FP_ALL_JOBS=1; "
                           "right 5 of 5 at load 2-9 (bench_nodes), 1 of 3 at load 9-17")
def test_a_straggler_on_node_0_is_named_with_its_node(nodes: Any, tmp_path: Path) -> None:
    jobs = nodes("sleep", {"FP_ODD_RANK": "1"})  # rank 1 (node 0) sleeps 40 ms every step
    out = tmp_path / "diag"
    diag = diagnose_nodes(CLI, jobs, out)
    check_nodes(jobs, diag)
    code, doc, err = merged_report(CLI, out)
    assert code == 0, err
    [f] = verdict(doc)
    assert (f["rule"], f["ranks"]) == ("job-straggler", [1]), f
    assert "rank 1 on node 0" in f["title"] and f["metrics"]["cause"] == "sleep", f
    check_alive_and_clean(jobs)


@ALL_JOBS
def test_a_healthy_two_node_job_has_no_verdict(nodes: Any, tmp_path: Path) -> None:
    jobs = nodes("healthy")
    out = tmp_path / "diag"
    diag = diagnose_nodes(CLI, jobs, out)
    check_nodes(jobs, diag)
    code, doc, _ = merged_report(CLI, out)
    assert code == 0 and verdict(doc) == [], verdict(doc)
    assert [n["ranks"] for n in doc["job"]["nodes"]] == [[0, 1], [2, 3]]
    check_alive_and_clean(jobs)
