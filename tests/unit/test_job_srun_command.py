"""job srun: the command lines built, the node's pid picked, the user's diagnose words checked,
and the errors when SLURM is missing or the job is not running (fake squeue on PATH)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flight_profiler.attach.ranks import ProcInfo
from flight_profiler.cli.job_cmd import _intersect_ranks, diagnose_args
from flight_profiler.diagnose import srun as srun_mod
from flight_profiler.diagnose.job_node import diagnose_argv, pick_target
from flight_profiler.errors import FlightProfilerError, ProcessNotFound, UsageError


def test_srun_argv_streams_one_node() -> None:
    argv = srun_mod.srun_argv("/usr/bin/srun", "42", "n7", ["/py", "-m", "flight_profiler"],
                              None, ["--duration", "2"], "auto")
    assert argv == ["/usr/bin/srun", "--overlap", "--jobid", "42", "--nodes", "1", "--ntasks",
                    "1", "--nodelist", "n7", "--kill-on-bad-exit=0", "/py", "-m",
                    "flight_profiler", "job", "node", "42", "--job-pid", "auto", "--stream",
                    "--", "--duration", "2"]


def test_srun_argv_shared_dir_writes_dir_node() -> None:
    argv = srun_mod.srun_argv("srun", "42", "n7", ["fp"], "/shared/d", [], "1234")
    assert argv[argv.index("--out") + 1] == "/shared/d/n7" and "--stream" not in argv
    assert argv[argv.index("--job-pid") + 1] == "1234" and argv[-1] == "--"


def test_diagnose_argv_names_this_nodes_ranks() -> None:
    assert diagnose_argv(99, [2, 3], "/o", ["train", "step"], python="/py") == [
        "/py", "-m", "flight_profiler", "diagnose", "99", "--all-ranks", "--ranks", "2-3",
        "--out", "/o", "train", "step"]


def test_diagnose_args_strip_all_ranks_and_refuse_owned_options() -> None:
    assert diagnose_args(("diagnose", "--all-ranks", "--calls", "5", "m", "f")) == [
        "--calls", "5", "m", "f"]
    with pytest.raises(UsageError, match="job srun runs diagnose"):
        diagnose_args(("stack",))
    with pytest.raises(UsageError, match="--out cannot be given"):
        diagnose_args(("diagnose", "--all-ranks", "--out=x"))
    with pytest.raises(UsageError, match="--arm cannot be given"):
        diagnose_args(("diagnose", "--arm", "hang 60"))


def test_intersect_ranks_keeps_this_nodes_share() -> None:
    here = [2, 3]
    assert _intersect_ranks(["--ranks", "0,3", "--calls", "2"], here) == ["--calls", "2"]
    assert here == [3]
    with pytest.raises(UsageError, match="none of ranks 0 is on this node"):
        _intersect_ranks(["--ranks", "0"], [2, 3])


def _proc(pid: int, ppid: int, rank: int | None, launcher: bool = False) -> ProcInfo:
    p = ProcInfo(pid=pid, ppid=ppid, user="u", cmdline=["python"], python="3.11", torch=True,
                 rank=rank, launcher=launcher, master="10.0.0.1:29500" if rank is not None
                 else None, run_id="r" if rank is not None else None)
    if rank is not None:
        p.launcher_pid = ppid
    return p


def test_pick_target_takes_the_ranks_of_this_job_on_this_node() -> None:
    procs = [_proc(10, 1, None, launcher=True), _proc(11, 10, 0), _proc(12, 10, 1),
             _proc(20, 1, None, launcher=True), _proc(21, 20, 2),  # another node's, same host
             _proc(31, 1, 0)]  # another SLURM job
    envs = {10: {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "a"},
            11: {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "a"},
            12: {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "a"},
            20: {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "b"},
            21: {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "b"},
            31: {"SLURM_JOB_ID": "8", "SLURMD_NODENAME": "a"}}
    target = pick_target("7", "a", procs, envs)
    assert (target.pid, target.ranks) == (11, [0, 1])
    assert pick_target("7", "b", procs, envs).ranks == [2]


def test_pick_target_refuses_none_and_two_jobs() -> None:
    with pytest.raises(ProcessNotFound, match="no rank of SLURM job 7 on node a"):
        pick_target("7", "a", [_proc(11, 10, 0)], {11: {"SLURM_JOB_ID": "8"}})
    other = _proc(41, 40, 0)
    other.master = "10.0.0.2:29501"
    procs = [_proc(11, 10, 0), other]
    envs = {11: {"SLURM_JOB_ID": "7"}, 41: {"SLURM_JOB_ID": "7"}}
    with pytest.raises(UsageError, match="runs 2 distributed jobs on this node") as err:
        pick_target("7", None, procs, envs)
    assert "pid 10" in err.value.message and "pid 40" in err.value.message


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_srun_missing_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FlightProfilerError, match="srun not found on PATH") as err:
        srun_mod.run_job("5", str(tmp_path / "o"), [], shared=False, timeout=10, fanout=1)
    assert err.value.exit_code == 1 and "slurm-client" in err.value.hint


@pytest.mark.parametrize(("squeue", "said"), [
    ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
     "SLURM job 5 is not running (slurm_load_jobs error: Invalid job id specified)"),
    ("echo 'PENDING|'", "SLURM job 5 is PENDING, not RUNNING"),
])
def test_job_not_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeue: str,
                         said: str) -> None:
    for tool in ("srun", "scontrol"):
        _fake_tool(tmp_path, tool, "exit 0\n")
    _fake_tool(tmp_path, "squeue", squeue + "\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(ProcessNotFound) as err:
        srun_mod.run_job("5", str(tmp_path / "o"), [], shared=False, timeout=10, fanout=1)
    assert err.value.message.startswith(said) and err.value.exit_code == 3
    assert not (tmp_path / "o").exists()


def test_bad_jobid_and_hostile_node_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="is not a SLURM job id"):
        srun_mod.job_nodes("5;rm")
    _fake_tool(tmp_path, "squeue", "echo 'RUNNING|x'\n")
    _fake_tool(tmp_path, "scontrol", "echo n1; echo ../etc\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(FlightProfilerError, match=r"'\.\./etc' is not a host name"):
        srun_mod.job_nodes("5")


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "flight_profiler", "job", "srun", "5", "--",
                           "stack"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("error: job srun runs diagnose on every node"), done.stderr


_FAKE_SRUN = """#!{python}
import io, os, signal, sys, time
from flight_profiler.diagnose.node_archive import pack
node = sys.argv[sys.argv.index("--nodelist") + 1]
if node == "hang":
    signal.signal(signal.SIGUSR1, lambda *a: sys.exit(130))  # the node's diagnose detached
    while True:
        time.sleep(0.1)
if node == "bad":
    print("error: no rank of SLURM job 5 on node bad", file=sys.stderr)
    sys.exit(2)
src = os.path.join(os.environ["FAKE_TREE"])
print("a prolog says hello")
pack(src, sys.stdout, node, 0)
"""


def test_run_job_collects_streams_names_failures_and_stops_hung_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "srun", "")
    (bin_dir / "srun").write_text(_FAKE_SRUN.format(python=sys.executable))
    _fake_tool(bin_dir, "squeue", "echo 'RUNNING|x'\n")
    _fake_tool(bin_dir, "scontrol", "echo good; echo bad; echo hang\n")
    tree = tmp_path / "tree"
    (tree / "rank0").mkdir(parents=True)
    (tree / "rank0" / "stacks.json").write_text("{}")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TREE", str(tree))
    said: list[str] = []
    run = srun_mod.run_job("5", str(tmp_path / "out"), [], shared=False, timeout=5, fanout=3,
                           progress=said.append)
    nodes = {n.node: n for n in run.nodes}
    assert nodes["good"].ok and nodes["good"].files == 1
    assert (tmp_path / "out" / "good" / "rank0" / "stacks.json").read_text() == "{}"
    assert nodes["bad"].error == "exit 2: error: no rank of SLURM job 5 on node bad"
    assert nodes["hang"].error is not None and "did not finish within --timeout" in nodes["hang"].error
    assert nodes["hang"].seconds < 15  # SIGUSR1 (the node step's stop) ended it at once
    assert run.missing == ["bad", "hang"]
    report = srun_mod.merge_report(run)
    missing = [i.error for i in report.inputs if i.kind == "node"]
    assert len(missing) == 2 and all("missing from the job report" in (m or "") for m in missing)
