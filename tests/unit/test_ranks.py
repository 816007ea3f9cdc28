"""Rank discovery and selection on recorded process facts (no live processes)."""

from __future__ import annotations

import pytest

from flight_profiler.attach.ranks import (
    ProcInfo,
    from_environ,
    group_jobs,
    is_launcher,
    is_spawned,
    job_of,
    select_ranks,
)
from flight_profiler.errors import ProcessNotFound, UsageError
from flight_profiler.rank_list import format_ranks, parse_ranks

LAUNCHER = ["/venv/bin/python", "-m", "torch.distributed.run", "--nproc-per-node", "4", "train.py"]


def _rank(pid: int, rank: int, run_id: str = "abc", port: str = "29500",
          launcher: int | None = 100) -> ProcInfo:
    p = ProcInfo(pid=pid, ppid=launcher or 1, user="u", cmdline=["python", "train.py"],
                 python="3.11", torch=True, launcher_pid=launcher)
    return from_environ(p, {"RANK": str(rank), "LOCAL_RANK": str(rank % 4), "WORLD_SIZE": "8",
                            "TORCHELASTIC_RUN_ID": run_id, "MASTER_ADDR": "node0",
                            "MASTER_PORT": port})


def test_environment_gives_the_rank_facts() -> None:
    p = _rank(201, 5)
    assert (p.rank, p.local_rank, p.world_size, p.run_id, p.master) == (5, 1, 8, "abc", "node0:29500")


def test_torchrun_and_the_module_form_are_launchers() -> None:
    assert is_launcher(LAUNCHER)
    assert is_launcher(["/usr/bin/torchrun", "--nproc-per-node=2", "t.py"])
    assert not is_launcher(["python", "train.py", "--note", "torch.distributed.run later"])


def test_ranks_group_by_job_and_sort_by_rank() -> None:
    procs = [_rank(203, 3), _rank(200, 0), _rank(311, 1, run_id="other", port="29501", launcher=300),
             _rank(202, 2), _rank(310, 0, run_id="other", port="29501", launcher=300)]
    jobs = group_jobs(procs)
    assert [[r.rank for r in j.ranks] for j in jobs] == [[0, 2, 3], [0, 1]]
    assert [j.launcher_pid for j in jobs] == [100, 300]


def test_job_of_accepts_the_launcher_or_any_rank() -> None:
    launcher = ProcInfo(100, 1, "u", LAUNCHER, "3.11", True, launcher=True)
    procs = [launcher, _rank(200, 0), _rank(201, 1)]
    assert [r.pid for r in job_of(100, procs).ranks] == [200, 201]
    assert [r.pid for r in job_of(201, procs).ranks] == [200, 201]


def test_job_of_a_plain_process_names_the_fix() -> None:
    plain = ProcInfo(50, 1, "u", ["python", "x.py"], "3.11", False)
    with pytest.raises(UsageError, match="neither a rank"):
        job_of(50, [plain, _rank(200, 0)])
    with pytest.raises(ProcessNotFound):
        job_of(4_194_400, [plain])  # above the kernel's largest pid_max: never a process


def test_select_ranks_and_missing_ones() -> None:
    job = group_jobs([_rank(200 + r, r) for r in range(6)])[0]
    assert [r.rank for r in select_ranks(job, parse_ranks("0,3-5"))] == [0, 3, 4, 5]
    with pytest.raises(UsageError, match="7 are not on this node"):
        select_ranks(job, {1, 7})


@pytest.mark.parametrize("spec", ["", "a", "3-1", "1,-2", ",,"])
def test_bad_rank_lists_are_usage_errors(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_ranks(spec)


def test_rank_lists_round_trip() -> None:
    assert format_ranks([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert parse_ranks(format_ranks([0, 1, 2, 5, 7, 8])) == {0, 1, 2, 5, 7, 8}


def test_rank_options_typed_inside_the_command() -> None:
    from flight_profiler.cli.ranks_cmd import extract_rank_options, per_rank_path

    assert extract_rank_options("stack --all-ranks") == ("stack", True, None)
    assert extract_rank_options("torch memory --ranks 0,3-5 -s") == ("torch memory -s", False, "0,3-5")
    assert extract_rank_options("watch m f --expr 'a, b'") == ("watch m f --expr 'a, b'", False, None)
    with pytest.raises(UsageError):
        extract_rank_options("stack --ranks")
    assert per_rank_path("/d/snap.pickle", 3) == "/d/snap_rank3.pickle"
    assert per_rank_path("/d/t.pt.trace.json.gz", 0) == "/d/t_rank0.pt.trace.json.gz"


def test_dataloader_workers_inherit_rank_but_are_not_ranks() -> None:
    rank0, rank1 = _rank(200, 0), _rank(201, 1)
    worker = _rank(300, 0, launcher=None)
    worker.ppid = 200  # forked by rank 0, same environment
    job = group_jobs([rank0, rank1, worker])[0]
    assert [r.pid for r in job.ranks] == [200, 201]
    assert [w.pid for w in job.workers] == [300] and job.workers[0].worker_of == 200
    with pytest.raises(UsageError, match="worker"):
        job_of(300, [rank0, rank1, worker])


def _node_rank(pid: int, rank: int, launcher: int, env: dict[str, str]) -> ProcInfo:
    p = ProcInfo(pid=pid, ppid=launcher, user="u", cmdline=["python", "train.py"],
                 python="3.11", torch=True, launcher_pid=launcher)
    return from_environ(p, {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4",
                            "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", **env})


def test_two_launchers_of_one_job_on_one_machine_are_two_nodes() -> None:
    # torchrun --nnodes 2 run twice on one machine: same run id and master, two launchers.
    l0 = ProcInfo(100, 1, "u", LAUNCHER, "3.11", True, launcher=True)
    l1 = ProcInfo(300, 1, "u", LAUNCHER, "3.11", True, launcher=True)
    procs = [l0, l1, _node_rank(200, 0, 100, {"GROUP_RANK": "0"}),
             _node_rank(201, 1, 100, {"GROUP_RANK": "0"}),
             _node_rank(302, 2, 300, {"GROUP_RANK": "1"}), _node_rank(303, 3, 300, {"GROUP_RANK": "1"})]
    assert [r.rank for r in job_of(100, procs).ranks] == [0, 1]
    assert [r.rank for r in job_of(300, procs).ranks] == [2, 3]
    assert [r.rank for r in job_of(302, procs).ranks] == [2, 3]  # a rank: its launcher's node
    assert job_of(303, procs).launcher_pid == 300


def test_node_rank_from_group_rank_else_slurm_else_derived() -> None:
    assert _node_rank(1, 3, 9, {"GROUP_RANK": "7"}).node_rank == 7
    assert _node_rank(1, 3, 9, {"SLURM_NODEID": "5"}).node_rank == 5
    derived = _node_rank(1, 3, 9, {"SLURM_JOB_ID": "4242"})
    assert (derived.node_rank, derived.slurm_job_id, derived.local_world_size) == (1, "4242", 2)


def test_identity_names_the_job_and_the_node() -> None:
    from flight_profiler.attach.ranks import identity

    ident = identity([_node_rank(302, 2, 300, {"GROUP_RANK": "1", "SLURM_JOB_ID": "77"}),
                      _node_rank(303, 3, 300, {"GROUP_RANK": "1", "SLURM_JOB_ID": "77"})])
    assert {k: ident[k] for k in ("run_id", "master", "slurm_job_id", "world_size", "node_rank")} \
        == {"run_id": "job1", "master": "127.0.0.1:29400", "slurm_job_id": "77", "world_size": 4,
            "node_rank": 1}
    assert ident["hostname"]


SPAWNED = ["/venv/bin/python", "-c", "from multiprocessing.spawn import spawn_main; "
           "spawn_main(tracker_fd=4, pipe_handle=9)", "--multiprocessing-fork"]


def _spawned(pid: int, ppid: int, ports: list[int], torch: bool = True) -> ProcInfo:
    return ProcInfo(pid=pid, ppid=ppid, user="u", cmdline=list(SPAWNED), python="3.11",
                    torch=torch, spawned=is_spawned(SPAWNED), tcp_ports=ports)


def test_ranks_started_by_torch_multiprocessing_spawn_are_a_job() -> None:
    # the DDP tutorial: `mp.spawn(demo_basic, nprocs=2)`: no RANK anywhere; both ranks use the
    # store's port (rank 0 listens on it, both connect); the resource tracker is a child too
    script = ProcInfo(100, 1, "u", ["python", "ddp_spawn.py"], "3.11", True)
    tracker = ProcInfo(101, 100, "u", ["python", "-c", "from multiprocessing.resource_tracker import main;main(3)"],
                       "3.11", False)
    rank1, rank0 = _spawned(103, 100, [12355, 40001]), _spawned(102, 100, [12355, 40002])
    worker = _spawned(200, 102, [])  # a DataLoader worker of rank 0 (spawn context)
    procs = [script, tracker, rank1, rank0, worker]
    [job] = group_jobs(procs)
    assert job.key == "spawn:100" and job.launcher_pid == 100 and job.world_size == 2
    assert [(r.rank, r.pid, r.rank_by) for r in job.ranks] == [(0, 102, "start order"), (1, 103, "start order")]
    assert [w.pid for w in job.workers] == [200]
    for pid in (100, 102, 103):
        assert [r.pid for r in job_of(pid, [_copy(p) for p in procs]).ranks] == [102, 103]


def _copy(p: ProcInfo) -> ProcInfo:
    return ProcInfo(**{**p.to_dict(), "tcp_ports": list(p.tcp_ports)})


def test_spawned_processes_that_share_no_port_are_no_job() -> None:
    # a DataLoader's spawned workers, or a Pool's: no process group between them
    script = ProcInfo(100, 1, "u", ["python", "train.py"], "3.11", True)
    procs = [script, _spawned(102, 100, []), _spawned(103, 100, [443])]
    assert group_jobs(procs) == []
    with pytest.raises(UsageError, match="neither a rank"):
        job_of(100, procs)


def test_grouping_spawned_ranks_twice_gives_the_same_job() -> None:
    script = ProcInfo(100, 1, "u", ["python", "ddp_spawn.py"], "3.11", True)
    procs = [script, _spawned(102, 100, [12355]), _spawned(103, 100, [12355])]
    first = [j.to_dict() for j in group_jobs(procs)]
    assert [j.to_dict() for j in group_jobs(procs)] == first and first[0]["key"] == "spawn:100"
