"""Where each rank is, and ranks grouped by identical stacks, on stacks recorded from real
torchrun jobs (tests/fixtures/ranks/<mode>/stacks/, 4 gloo ranks, 3 samples each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flight_profiler.report.rank_stacks import group_stacks, parse_stacks, position, rank_position

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ranks"


def _last_samples(mode: str) -> dict[int, dict[str, Any]]:
    out = {}
    for f in sorted((FIXTURES / mode / "stacks").glob("stacks_rank*.json")):
        data = parse_stacks(f.read_text())
        out[data["rank"]] = data["samples"][-1]
    return out


def test_a_rank_in_all_reduce_is_placed_at_the_users_line() -> None:
    p = rank_position(_last_samples("stuck")[0])
    assert (p.kind, p.op, p.function) == ("collective", "all_reduce", "train_step")
    assert p.where.startswith("distributed_job.py:")


def test_a_rank_outside_collectives_is_placed_where_it_is() -> None:
    p = rank_position(_last_samples("stuck")[3])
    assert (p.kind, p.function) == ("python", "stuck_outside")


def test_data_loading_is_recognised() -> None:
    frames = [{"file": "/w/train.py", "line": 10, "function": "main"},
              {"file": "/v/site-packages/torch/utils/data/dataloader.py", "line": 700,
               "function": "__next__"}]
    p = position(frames)
    assert (p.kind, p.where, p.function) == ("data", "train.py:10", "main")


def test_grouping_names_the_odd_rank() -> None:
    g = group_stacks(_last_samples("stuck"))
    primary = g.primary
    assert primary[0].ranks == [0, 1, 2] and not primary[0].odd
    assert [x.ranks for x in g.odd] == [[3]]
    assert g.to_dict()["odd_ranks"] == [3]


def test_skipped_collective_groups_by_call_site() -> None:
    g = group_stacks(_last_samples("skip"))
    ops = {tuple(x.ranks): x.position.op for x in g.primary}
    assert ops == {(0, 1, 2): "all_reduce", (3,): "barrier"}
    assert [x.ranks for x in g.odd] == [[3]]


def test_two_ranks_without_majority_call_out_the_one_outside() -> None:
    samples = _last_samples("stuck")
    g = group_stacks({0: samples[0], 3: samples[3]})
    assert [x.ranks for x in g.odd] == [[3]]


def test_identical_stacks_have_nothing_odd() -> None:
    s = _last_samples("stuck")[0]
    g = group_stacks({r: json.loads(json.dumps(s)) for r in range(8)})
    assert len(g.primary) == 1 and g.primary[0].ranks == list(range(8)) and not g.odd


def test_torch_work_in_a_worker_thread_is_found_there() -> None:
    in_collective = _last_samples("stuck")[0]["threads"][0]
    main = {"name": "MainThread", "main": True, "agent": False,
            "frames": [{"file": "/w/train.py", "line": 90, "function": "main"},
                       {"file": "/usr/lib/python3.11/threading.py", "line": 1119, "function": "join"}]}
    worker = dict(in_collective, name="trainer", main=False)
    p = rank_position({"threads": [main, worker]})
    assert (p.kind, p.op, p.function) == ("collective", "all_reduce", "train_step")
    g = group_stacks({0: {"threads": [main, worker]}, 1: {"threads": [main, worker]}})
    assert g.primary[0].thread == "trainer" and g.primary[0].ranks == [0, 1]


_PY = "/root/.pyenv/versions/3.11.7/lib/python3.11"
_TORCH = "/w/.venv/lib/python3.11/site-packages/torch"


def test_a_rank_hung_in_a_queue_is_placed_at_the_programs_line_not_threading() -> None:
    frames = [{"file": "/w/ddp_trainer.py", "line": 140, "function": "main"},
              {"file": "/w/ddp_trainer.py", "line": 94, "function": "Prefetcher.wait_for_batch"},
              {"file": f"{_PY}/queue.py", "line": 171, "function": "Queue.get"},
              {"file": f"{_PY}/threading.py", "line": 327, "function": "Condition.wait"}]
    p = position(frames)
    assert (p.kind, p.where, p.function) == ("python", "ddp_trainer.py:94", "Prefetcher.wait_for_batch")
    assert p.context == ("Queue.get at queue.py:171", "Condition.wait at threading.py:327")
    assert p.describe() == ("Prefetcher.wait_for_batch at ddp_trainer.py:94, in Condition.wait at "
                            "threading.py:327 < Queue.get at queue.py:171")


def test_backward_is_its_own_place_ddp_waits_there() -> None:
    frames = [{"file": "/w/ddp_trainer.py", "line": 140, "function": "main"},
              {"file": "/w/ddp_trainer.py", "line": 102, "function": "train_step"},
              {"file": f"{_TORCH}/_tensor.py", "line": 626, "function": "Tensor.backward"},
              {"file": f"{_TORCH}/autograd/__init__.py", "line": 395, "function": "backward"},
              {"file": f"{_TORCH}/autograd/graph.py", "line": 979, "function": "_engine_run_backward"}]
    p = position(frames)
    assert (p.kind, p.where, p.function) == ("backward", "ddp_trainer.py:102", "train_step")


def test_a_stack_file_keeps_the_node_it_was_taken_on() -> None:
    from flight_profiler.report.rank_stacks import stacks_document

    doc = stacks_document(3, 42, 4, [], None, {"node_rank": 1, "hostname": "gpu-07"})
    assert parse_stacks(json.dumps(doc))["node"] == {"node_rank": 1, "hostname": "gpu-07"}
    doc["node"] = {"node_rank": "1; rm -rf", "hostname": "a\nb"}  # malformed: dropped, not trusted
    assert parse_stacks(json.dumps(doc))["node"] == {"node_rank": None, "hostname": None}
