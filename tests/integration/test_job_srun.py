"""`job srun` against a real SLURM: two slurmd nodes on this host (slurm_cluster.py), a DDP job
(job_workloads/ddp_trainer.py, gloo, one torchrun per node started by srun inside an sbatch
allocation), then `flight_profiler job srun JOBID -- diagnose --all-ranks` from outside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurm_cluster

from flight_profiler.agent import protocol

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.slurm]

TRAINER = Path(__file__).parent / "job_workloads" / "ddp_trainer.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.Cluster]:
    yield from slurm_cluster.start(tmp_path_factory.mktemp("slurm"))


@pytest.fixture(scope="module")
def ddp_job(cluster: slurm_cluster.Cluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, dict[int, int]]]:
    work = tmp_path_factory.mktemp("ddpjob")
    ready = work / "ready"
    ready.mkdir()
    (port,) = slurm_cluster._free_ports(1)
    script = work / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "srun --ntasks-per-node=1 bash -c 'exec " + sys.executable + " -m torch.distributed.run "
        "--nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID --master-addr 127.0.0.1 "
        f"--master-port {port} {TRAINER} healthy {ready}'\n")
    done = cluster.run("sbatch", "--parsable", "-N2", "--ntasks-per-node=1",
                       "-o", str(work / "job-%j.out"), str(script))
    assert done.returncode == 0, done.stderr
    jobid = done.stdout.strip().split(";")[0]
    pids: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while len(list(ready.iterdir())) < 2:
            state = cluster.run("squeue", "-h", "-j", jobid, "-o", "%T").stdout.strip()
            assert state in ("PENDING", "RUNNING", "CONFIGURING"), (state, _out(work))
            assert time.monotonic() < deadline, _out(work)
            time.sleep(1)
        pids = {int(p.name[4:]): int(p.read_text().strip() or 0) for p in ready.iterdir()}
        yield jobid, pids
    finally:
        cluster.run("scancel", "--full", jobid)
        _wait_gone(list(pids.values()))


def _wait_gone(pids: list[int], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)


def _out(work: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in work.glob("job-*.out"))


def _job(cluster: slurm_cluster.Cluster, *args: str, timeout: float = 400
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flight_profiler", "job", *args],
                          env=cluster.env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _nodes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in doc["nodes"]}


def test_job_srun_streams_every_node_back_into_one_report(
        cluster: slurm_cluster.Cluster, ddp_job: tuple[str, dict[int, int]], tmp_path: Path
) -> None:
    jobid, pids = ddp_job
    out = tmp_path / "diag"
    done = _job(cluster, "srun", jobid, "--out", str(out), "--json", "--timeout", "300",
                "--", "diagnose", "--all-ranks", "--duration", "2", "--timeout", "20")
    doc = json.loads(done.stdout)
    nodes = _nodes(doc)
    assert set(nodes) == {"n1", "n2"} and doc["missing_nodes"] == [], done.stderr
    assert all(n["ok"] for n in nodes.values()), nodes
    # a node whose diagnose lost a phase (a loaded host) makes the job's diagnosis incomplete
    codes = {n["exit_code"] for n in nodes.values()}
    assert codes <= {0, 12} and done.returncode == max(codes), (codes, done.returncode)
    # each node diagnosed only its own rank (node rank i runs rank i), streamed and unpacked
    assert [p.name for p in sorted((out / "n1").glob("rank*"))] == ["rank0"]
    assert [p.name for p in sorted((out / "n2").glob("rank*"))] == ["rank1"]
    trace = out / "n2" / "traces" / "rank1.pt.trace.json.gz"
    assert trace.stat().st_ino == (out / "n2" / "rank1" / "profile.json.gz").stat().st_ino
    report = json.loads((out / "report.json").read_text())
    ranks = {i.get("rank") for i in report["inputs"] if i["ok"]}
    assert {0, 1} <= ranks, ranks
    assert_alive_and_clean(pids)


def test_job_srun_shared_dir_and_a_failing_node_is_named(
        cluster: slurm_cluster.Cluster, ddp_job: tuple[str, dict[int, int]], tmp_path: Path
) -> None:
    jobid, pids = ddp_job
    out = tmp_path / "diag"
    # --ranks 1: n1 holds no selected rank, its step fails; n2's result is kept
    done = _job(cluster, "srun", jobid, "--out", str(out), "--shared", "--json",
                "--timeout", "300", "--", "diagnose", "--all-ranks", "--ranks", "1",
                "--duration", "1", "--timeout", "20")
    assert done.returncode == 12, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    nodes = _nodes(doc)
    assert doc["missing_nodes"] == ["n1"]
    assert "none of ranks 1 is on this node" in nodes["n1"]["error"], nodes["n1"]
    assert nodes["n2"]["ok"] and (out / "n2" / "rank1").is_dir()
    report = json.loads((out / "report.json").read_text())
    said = [i["error"] for i in report["inputs"] if not i["ok"] and i["kind"] == "node"]
    assert len(said) == 1 and "node n1 missing from the job report" in said[0]
    assert_alive_and_clean(pids)


def test_job_srun_timeout_stops_every_node_and_leaves_the_ranks_clean(
        cluster: slurm_cluster.Cluster, ddp_job: tuple[str, dict[int, int]], tmp_path: Path
) -> None:
    jobid, pids = ddp_job
    out = tmp_path / "diag"
    start = time.monotonic()
    # --duration 30: a diagnosis lasts 30 s at least (its censuses are that far apart), so
    # --timeout 12 stops both nodes in the middle of it (with --duration 5 a node diagnosed
    # its ranks in under 12 s once diagnose got faster, and was not stopped)
    done = _job(cluster, "srun", jobid, "--out", str(out), "--json", "--timeout", "12", "--",
                "diagnose", "--all-ranks", "--duration", "30", "--timeout", "20")
    took = time.monotonic() - start
    assert done.returncode == 12, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["missing_nodes"] == ["n1", "n2"]
    assert all("did not finish within --timeout" in n["error"] for n in doc["nodes"]), doc
    assert took < 12 + 100, took  # the nodes' diagnose end within their grace, then srun
    steps = cluster.run("squeue", "-h", "-s", "-j", jobid, "-o", "%i").stdout.split()
    # the batch step and the job's own srun (step 0) only: every step of ours has ended
    assert set(steps) <= {f"{jobid}.batch", f"{jobid}.extern", f"{jobid}.0"}, steps
    assert_alive_and_clean(pids)


def assert_alive_and_clean(pids: dict[int, int]) -> None:
    assert len(pids) == 2, pids
    deadline = time.monotonic() + 10  # an agent's detach may end just after diagnose's exit
    while time.monotonic() < deadline and any(
            os.path.exists(protocol.socket_path(pid, os.geteuid(), "/")) for pid in pids.values()):
        time.sleep(0.5)
    for rank, pid in pids.items():
        assert os.path.exists(f"/proc/{pid}"), f"rank {rank} died"
        status = Path(f"/proc/{pid}/status").read_text()
        assert "TracerPid:\t0" in status, f"rank {rank} is still traced"
        assert not os.path.exists(protocol.socket_path(pid, os.geteuid(), "/")), \
            f"an agent is still attached to rank {rank}"


def test_job_srun_refuses_a_job_that_is_not_running(
        cluster: slurm_cluster.Cluster, tmp_path: Path) -> None:
    done = _job(cluster, "srun", "999999", "--out", str(tmp_path / "d"), "--",
                "diagnose", "--all-ranks", timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: SLURM job 999999 is not running"), done.stderr
    assert not (tmp_path / "d").exists()
