"""Whole jobs: real torchrun jobs (gloo, CPU, 2-3 ranks) with one planted problem each, seen
through `ps`, `PID --all-ranks --cmd ...` and `diagnose PID --all-ranks`: the example job
(explicit all_reduce), and a DDP trainer written as users write one (job_workloads/ddp_trainer.py:
DistributedDataParallel, DistributedSampler, a DataLoader with workers, a prefetch thread).

Each test checks the diagnosis names the right rank and line, that every rank is still alive
afterwards and that nothing is left attached (no agent socket, no tracer). The DDP jobs that
need the whole per-rank workflow (~40 s each here) run with FP_ALL_JOBS=1; the bench runs each
job three times (bench/bench_ranks.py --verdicts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.agent import protocol
from support import torch_available
from torchrun_jobs import DDP_TRAINER, kill_ranks
from torchrun_jobs import Job as DdpJob

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_available(), reason="torchrun jobs need torch"),
]

CLI = [sys.executable, "-m", "flight_profiler"]
WORKLOAD = Path(__file__).resolve().parents[2] / "examples" / "distributed_job.py"


class Job:
    def __init__(self, popen: subprocess.Popen[bytes], ready: Path, n: int, log: Path) -> None:
        self.popen, self.ready, self.n, self.log = popen, ready, n, log
        self.launcher = popen.pid
        self.pids: dict[int, int] = {}

    def wait_ready(self, timeout: float = 120.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = list(self.ready.glob("rank*"))
            if len(files) == self.n and all(f.read_text() for f in files):
                self.pids = {int(f.name[4:]): int(f.read_text()) for f in files}
                return self.pids
            assert self.popen.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError("the ranks did not start: " + self.log.read_text()[-3000:])


@pytest.fixture
def torchrun(tmp_path: Path) -> Iterator[Any]:
    jobs: list[Job] = []

    def start(mode: str, n: int, env: dict[str, str] | None = None) -> Job:
        ready = tmp_path / f"ready-{mode}"
        ready.mkdir()
        log = tmp_path / f"{mode}.log"
        with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                 "--standalone", str(WORKLOAD), mode, str(ready)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **(env or {})})
        job = Job(popen, ready, n, log)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        if job.popen.poll() is None:
            os.killpg(job.popen.pid, signal.SIGTERM)
            try:
                job.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(job.popen.pid, signal.SIGKILL)
                job.popen.wait(10)
                kill_ranks(job.pids.values())  # own sessions: the launcher's group misses them


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def assert_alive_and_clean(pids: dict[int, int]) -> None:
    for rank, pid in pids.items():
        assert os.path.exists(f"/proc/{pid}"), f"rank {rank} died"
        status = Path(f"/proc/{pid}/status").read_text()
        assert "TracerPid:\t0" in status, f"rank {rank} is still traced"
        assert not os.path.exists(protocol.socket_path(pid, os.geteuid(), "/")), \
            f"an agent is still attached to rank {rank}"


def diagnose_job(pid: int, out: Path, *extra: str, duration: str = "2") -> dict[str, Any]:
    proc = run_cli("diagnose", str(pid), "--all-ranks", "--out", str(out), "--duration", duration,
                   "--timeout", "20", "--json", *extra)
    result: dict[str, Any] = json.loads(proc.stdout or "{}")
    # 0, or 12 when some evidence is missing (a phase failed on this loaded machine): the
    # document then says which, and carries the same code
    assert proc.returncode in (0, 12), proc.stdout + proc.stderr
    assert result["exit_code"] == proc.returncode
    assert bool(result["missing"]) == (proc.returncode == 12), result["missing"]
    assert (out / "report.json").exists() and (out / "report.html").exists()
    return result


def job_findings(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in result["findings"] if f["rule"].startswith("job-")]


def test_healthy_job_ps_all_ranks_and_a_clean_diagnosis(torchrun: Any, tmp_path: Path) -> None:
    job = torchrun("healthy", 2)
    pids = job.wait_ready()
    # ps: the job, its launcher and both ranks
    ps = run_cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    [mine] = [j for j in json.loads(ps.stdout)["jobs"] if j["launcher_pid"] == job.launcher]
    assert {r["rank"]: r["pid"] for r in mine["ranks"]} == pids
    # each rank's DataLoader worker inherited RANK: listed as a worker, never as a rank
    assert sorted(w["worker_of"] for w in mine["workers"]) == sorted(pids.values())
    assert all(r["torch"] and r["world_size"] == 2 for r in mine["ranks"])
    # one command on every rank, from the launcher's pid: one document keyed by rank
    proc = run_cli(str(job.launcher), "--all-ranks", "--cmd", "stack", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert {k: v["pid"] for k, v in doc["ranks"].items()} == {str(r): p for r, p in pids.items()}
    assert all(v["ok"] and v["result"]["threads"] for v in doc["ranks"].values())
    assert doc["grouped"]["ranks"] == [0, 1]
    # --ranks picks some, from any rank's pid
    proc = run_cli(str(pids[1]), "--ranks", "1", "--cmd", "status", "--json")
    assert list(json.loads(proc.stdout)["ranks"]) == ["1"], proc.stdout + proc.stderr
    # the shell runs each line on every rank
    shell = subprocess.run([*CLI, str(job.launcher), "--all-ranks"], input="status\nquit\n",
                           capture_output=True, text=True, timeout=120)
    assert all(f"rank {r} (pid {p}" in shell.stdout for r, p in pids.items()), shell.stdout + shell.stderr
    run_cli(str(job.launcher), "--all-ranks", "--cmd", "detach")
    # the whole diagnosis: no job-level problem in a healthy job
    result = diagnose_job(job.launcher, tmp_path / "diag")
    assert set(result["ranks"]) == {"0", "1"}
    assert all(r["diagnose_ok"] for r in result["ranks"].values()), result["ranks"]
    assert [f for f in job_findings(result) if f["severity"] != "info"] == []
    assert_alive_and_clean(pids)


def test_rank_stuck_outside_the_collective(torchrun: Any, tmp_path: Path) -> None:
    job = torchrun("stuck", 3, {"TORCH_FR_BUFFER_SIZE": "2000"})
    pids = job.wait_ready()
    time.sleep(1.0)  # the odd rank reaches its sleep after step 5
    result = diagnose_job(pids[0], tmp_path / "diag")
    [f] = [f for f in job_findings(result) if f["severity"] == "critical"]
    assert (f["rule"], f["ranks"]) == ("job-hang", [2])
    assert "stuck_outside" in f["summary"] and "all_reduce" in f["summary"]
    # Flight Recorder (gloo) agrees: rank 2 enqueued one collective less
    assert f["metrics"]["flight_recorder_behind"] == [2]
    assert result["per_rank_phases_skipped"]
    assert_alive_and_clean(pids)


def test_rank_that_skips_a_collective(torchrun: Any, tmp_path: Path) -> None:
    job = torchrun("skip", 3)
    pids = job.wait_ready()
    time.sleep(1.0)
    # the grouped stacks call the odd rank out
    proc = run_cli(str(job.launcher), "--all-ranks", "--cmd", "stack")
    assert "odd:" in proc.stdout and "barrier" in proc.stdout, proc.stdout + proc.stderr
    run_cli(str(job.launcher), "--all-ranks", "--cmd", "detach")
    result = diagnose_job(job.launcher, tmp_path / "diag")
    [f] = [f for f in job_findings(result) if f["severity"] == "critical"]
    assert (f["rule"], f["ranks"]) == ("job-desync", [2])
    assert_alive_and_clean(pids)


def test_straggler_rank(torchrun: Any, tmp_path: Path) -> None:
    job = torchrun("straggler", 2)
    pids = job.wait_ready()
    result = diagnose_job(job.launcher, tmp_path / "diag")
    found = {f["rule"]: f for f in job_findings(result)}
    assert "job-hang" not in found and "job-desync" not in found
    f = found["job-straggler"]
    assert f["ranks"] == [1]
    per = f["metrics"]["ranks"]
    assert per["1"]["compute_pct"] > per["0"]["compute_pct"]
    # OUT/traces is an HTA trace directory: only traces, each with distributedInfo.rank
    import gzip

    hta_dir = tmp_path / "diag" / "traces"
    assert result["outputs"]["hta_trace_dir"] == str(hta_dir)
    assert sorted(p.name for p in hta_dir.iterdir()) == ["rank0.pt.trace.json.gz",
                                                         "rank1.pt.trace.json.gz"]
    for rank in (0, 1):
        with gzip.open(hta_dir / f"rank{rank}.pt.trace.json.gz", "rt") as fh:
            assert json.load(fh)["distributedInfo"]["rank"] == rank
    assert_alive_and_clean(pids)


# -- DDP jobs --------------------------------------------------------------------------------

ALL_JOBS = pytest.mark.skipif(not os.environ.get("FP_ALL_JOBS"),
                              reason="the whole per-rank workflow, ~40 s a job: FP_ALL_JOBS=1")


@pytest.fixture
def ddp(tmp_path: Path) -> Iterator[Any]:
    jobs: list[DdpJob] = []

    def start(mode: str, n: int = 2, fr: bool = False) -> DdpJob:
        job = DdpJob(DDP_TRAINER, mode, n, tmp_path, {"TORCH_FR_BUFFER_SIZE": "2000"} if fr else None)
        jobs.append(job)
        job.wait_ready()
        time.sleep(1.5)  # past step 6, where the planted problem starts
        return job

    yield start
    for job in jobs:
        job.stop()


def test_ddp_rank_hung_in_its_queue_is_named_at_its_own_line(ddp: Any, tmp_path: Path) -> None:
    # rank 1's prefetch thread died: it waits for a batch forever; rank 0 waits in backward for
    # its gradient all-reduce (no Python collective frame: DDP runs it in autograd hooks)
    job = ddp("hang", 2, fr=True)
    result = diagnose_job(job.launcher, tmp_path / "diag")
    [f] = [f for f in job_findings(result) if f["severity"] == "critical"]
    assert (f["rule"], f["ranks"]) == ("job-hang", [1])
    assert "DDP gradient all-reduce" in f["title"]
    [where] = f["where"]
    assert "ddp_trainer.py:" in where and "in Prefetcher.wait_for_batch" in where, where
    assert "(in Condition.wait at threading.py:" in where  # the library frames, as context
    assert f["metrics"]["flight_recorder_behind"] == [1]
    assert result["per_rank_phases_skipped"] and result["exit_code"] == 0
    assert not job.dead_ranks()
    assert_alive_and_clean(job.pids)


def test_ddp_rank_that_skips_a_barrier_is_a_desync(ddp: Any, tmp_path: Path) -> None:
    job = ddp("skip", 3, fr=True)
    result = diagnose_job(job.launcher, tmp_path / "diag")
    [f] = [f for f in job_findings(result) if f["severity"] == "critical"]
    assert (f["rule"], f["ranks"]) == ("job-desync", [2])
    assert "barrier" in f["summary"] and "DDP gradient all-reduce" in f["summary"]
    assert not job.dead_ranks()
    assert_alive_and_clean(job.pids)


def _straggler(result: dict[str, Any]) -> dict[str, Any]:
    found = [f for f in job_findings(result) if f["severity"] != "info"]
    assert [f["rule"] for f in found] == ["job-straggler"], found  # one verdict, no contradiction
    return found[0]


def test_ddp_rank_that_sleeps_is_the_straggler(ddp: Any, tmp_path: Path) -> None:
    # the miss: nothing above info in 18 runs; no Flight Recorder in this job
    job = ddp("sleep", 2)
    f = _straggler(diagnose_job(job.launcher, tmp_path / "diag", duration="1.5"))
    assert f["ranks"] == [1] and f["metrics"]["cause"] == "sleep"
    assert f["metrics"]["line"].endswith("(log_metrics)"), f["metrics"]["line"]
    assert any("Flight Recorder: not enabled" in e for e in f["evidence"])
    assert not job.dead_ranks()
    assert_alive_and_clean(job.pids)


@ALL_JOBS
def test_ddp_rank_slow_in_data_loading_is_the_straggler(ddp: Any, tmp_path: Path) -> None:
    job = ddp("slow_data", 2, fr=True)
    f = _straggler(diagnose_job(job.launcher, tmp_path / "diag", duration="1.5"))
    assert f["ranks"] == [1] and "DataLoader" in f["summary"]
    assert "wait_for_batch" in (f["metrics"]["line"] or ""), f["metrics"]
    assert any("Flight Recorder agrees: rank 1" in e for e in f["evidence"])
    assert_alive_and_clean(job.pids)


@ALL_JOBS
def test_ddp_rank_slow_in_compute_is_the_straggler(ddp: Any, tmp_path: Path) -> None:
    job = ddp("slow_compute", 2)
    f = _straggler(diagnose_job(job.launcher, tmp_path / "diag", duration="1.5"))
    assert f["ranks"] == [1] and f["metrics"]["cause"] == "compute"
    assert "expensive_metric" in (f["metrics"]["line"] or ""), f["metrics"]
    assert_alive_and_clean(job.pids)


@ALL_JOBS
def test_healthy_ddp_job_has_no_verdict(ddp: Any, tmp_path: Path) -> None:
    job = ddp("healthy", 2, fr=True)
    result = diagnose_job(job.launcher, tmp_path / "diag", duration="1.5")
    assert [f for f in job_findings(result) if f["severity"] != "info"] == []
    assert_alive_and_clean(job.pids)


def test_a_rank_killed_mid_run_makes_the_diagnosis_incomplete(ddp: Any, tmp_path: Path) -> None:
    # the run: a rank died during the diagnosis, the other's phases failed after it
    # (gloo's "Connection reset by peer", torchrun ends the job): exit 12, not 0
    job = ddp("healthy", 2)
    out = tmp_path / "diag"
    proc = subprocess.Popen([*CLI, "diagnose", str(job.launcher), "--all-ranks", "--out", str(out),
                             "--duration", "2", "--timeout", "10", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("stacks/stacks_rank*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # into the per-rank phases
    os.kill(job.pids[1], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 12, stdout + stderr
    doc = json.loads(stdout)
    assert doc["exit_code"] == 12
    assert {g["rank"] for g in doc["missing"]} >= {1}, doc["missing"]
