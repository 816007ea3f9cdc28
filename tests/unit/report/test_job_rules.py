"""The job rules (job-hang, job-desync, job-straggler, job-imbalance) on recorded per-rank data:
stacks of real torchrun jobs, and per-rank traces / snapshots of known shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from job_synth import job_traces
from report_synth import snapshot, write_pickle

from flight_profiler.report import analyze

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ranks"


def _findings(paths: list[Path] | list[str], rule_prefix: str = "job-") -> list[dict]:
    report = analyze([str(p) for p in paths], jobs=1)
    return [f.to_dict() for f in report.findings if f.rule.startswith(rule_prefix)]


def test_rank_stuck_outside_the_collective_is_a_critical_hang() -> None:
    [f] = _findings([FIXTURES / "stuck"])
    assert (f["rule"], f["severity"], f["ranks"]) == ("job-hang", "critical", [3])
    assert "stuck_outside" in f["summary"] and "all_reduce" in f["summary"]
    assert f["metrics"]["waiting_ranks"] == [0, 1, 2]


def test_skipped_collective_is_a_desync_naming_the_rank() -> None:
    [f] = _findings([FIXTURES / "skip"])
    assert (f["rule"], f["severity"], f["ranks"]) == ("job-desync", "critical", [3])
    assert "barrier" in f["summary"] and "all_reduce" in f["summary"]


def test_healthy_job_gets_no_job_finding() -> None:
    assert _findings([FIXTURES / "healthy"]) == []


def test_moving_odd_rank_is_a_warning_not_a_hang(tmp_path: Path) -> None:
    # Same waiting ranks, but rank 3's stack changes between samples: behind, not stuck.
    for f in (FIXTURES / "stuck" / "stacks").glob("*.json"):
        doc = json.loads(f.read_text())
        if doc["rank"] == 3:
            for i, s in enumerate(doc["samples"]):
                s["threads"][0]["frames"][-1]["line"] += i
        (tmp_path / f.name).write_text(json.dumps(doc))
    [f] = _findings([tmp_path])
    assert (f["rule"], f["severity"], f["ranks"]) == ("job-hang", "warning", [3])


def _same_line_every_sample(tmp_path: Path, keep_counters: bool) -> Path:
    """The recorded straggler job (ranks 0-2 wait in all_reduce, rank 3 computes longer), as CI
    once sampled it on a loaded machine: every sample caught three ranks in all_reduce and one
    (here rank 1) at the same line (its time.sleep), so every stack looked stuck. The kernel's counters of
    the recorded samples say otherwise: the waiting threads woke up hundreds of times."""
    for f in (FIXTURES / "straggler" / "stacks").glob("*.json"):
        doc = json.loads(f.read_text())
        place = "all_reduce" if doc["rank"] != 1 else "main"
        model = next(t for s in doc["samples"] for t in s["threads"]
                     if t["main"] and t["frames"][-1]["function"] == place)
        for s in doc["samples"]:
            main = next(t for t in s["threads"] if t["main"])
            main["frames"] = model["frames"]
            if not keep_counters:
                main.pop("progress", None)
        (tmp_path / f.name).write_text(json.dumps(doc))
    return tmp_path


def test_waiting_ranks_whose_threads_keep_waking_are_not_hung(tmp_path: Path) -> None:
    found = _findings([_same_line_every_sample(tmp_path, keep_counters=True)])
    assert [(f["rule"], f["severity"], f["ranks"]) for f in found] == [("job-hang", "warning", [1])]
    assert "woke up" in " ".join(found[0]["evidence"])


def test_without_the_counters_the_same_samples_read_as_a_hang(tmp_path: Path) -> None:
    # what the rule said before the counters (and says for samples taken without them)
    found = _findings([_same_line_every_sample(tmp_path, keep_counters=False)])
    assert [(f["rule"], f["severity"], f["ranks"]) for f in found] == [("job-hang", "critical", [1])]


def test_hung_ranks_recorded_with_the_counters_never_woke_up() -> None:
    for f in (FIXTURES / "stuck" / "stacks").glob("*.json"):
        doc = json.loads(f.read_text())
        counts = {next(t for t in s["threads"] if t["main"])["progress"]["switches"]
                  for s in doc["samples"]}
        assert len(counts) == 1, (f.name, counts)


def test_moving_odd_rank_with_traces_is_the_stragglers_not_a_hang(tmp_path: Path) -> None:
    # GIVEN the moving odd rank 3 above, and per-rank traces of the same job in which rank 3
    # computes 3x longer while the others wait (what diagnose --all-ranks collects)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    for f in (FIXTURES / "stuck" / "stacks").glob("*.json"):
        doc = json.loads(f.read_text())
        if doc["rank"] == 3:
            for i, s in enumerate(doc["samples"]):
                s["threads"][0]["frames"][-1]["line"] += i
        (stacks / f.name).write_text(json.dumps(doc))
    traces = job_traces(tmp_path / "traces", [2000.0, 2000.0, 2100.0, 6000.0], jitter=0.02)
    # WHEN both are analysed, THEN rank 3 is named once, as the straggler, not as a hang
    found = _findings([stacks, *traces])
    assert [(f["rule"], f["ranks"]) for f in found] == [("job-straggler", [3])]


def test_missing_ranks_are_named_when_all_local_ranks_wait(tmp_path: Path) -> None:
    for f in (FIXTURES / "stuck" / "stacks").glob("*.json"):
        doc = json.loads(f.read_text())
        if doc["rank"] != 3:
            doc["world_size"] = 8
            (tmp_path / f.name).write_text(json.dumps(doc))
    [f] = _findings([tmp_path])
    assert f["rule"] == "job-hang" and f["ranks"] == [3, 4, 5, 6, 7]


def test_flight_recorder_sequence_ids_say_who_is_behind(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "stuck" / "stacks", tmp_path / "s")
    for f in (tmp_path / "s").glob("*.json"):
        doc = json.loads(f.read_text())
        doc["flight_recorder"] = {"last_enqueued": {"0": 41 if doc["rank"] == 3 else 42}}
        f.write_text(json.dumps(doc))
    [f] = _findings([tmp_path])
    assert f["metrics"]["flight_recorder_behind"] == [3]
    assert any("#41" in e for e in f["evidence"])


def test_straggler_is_named_with_its_compute_and_the_others_wait(tmp_path: Path) -> None:
    # rank 3 runs the others' operators, each 3x longer: named, but at info (the same work
    # running slower is what a busy host does too; more work per step is a warning:
    # test_job_verdict.py)
    paths = job_traces(tmp_path, [2000.0, 2000.0, 2100.0, 6000.0], jitter=0.02)
    [f] = _findings(paths, "job-straggler")
    assert f["ranks"] == [3] and f["severity"] == "info" and f["metrics"]["cause"] == "slower"
    per = f["metrics"]["ranks"]
    assert per["3"]["compute_pct"] > 2 * per["0"]["compute_pct"]
    assert per["0"]["collective_pct"] > per["3"]["collective_pct"]
    assert any("aten::" in w for w in f["where"])


def test_balanced_ranks_have_no_straggler(tmp_path: Path) -> None:
    paths = job_traces(tmp_path, [2000.0, 2050.0, 1950.0, 2020.0], jitter=0.05)
    assert _findings(paths) == []


def test_memory_imbalance_names_the_heavy_rank(tmp_path: Path) -> None:
    paths = []
    for r in range(4):
        mib = 900 if r == 2 else 500
        paths.append(write_pickle(tmp_path / f"snap_rank{r}.pickle",
                                  snapshot(allocated=[(mib << 20, "train.py", 40)])))
    found = _findings(paths, "job-imbalance")
    assert found and all(f["ranks"] == [2] for f in found)
    assert {f["metrics"]["key"] for f in found} == {"allocated", "reserved"}


def test_memory_within_noise_is_not_imbalance(tmp_path: Path) -> None:
    paths = [write_pickle(tmp_path / f"snap_rank{r}.pickle",
                          snapshot(allocated=[((500 + r) << 20, "train.py", 40)])) for r in range(4)]
    assert _findings(paths, "job-imbalance") == []


def test_flight_recorder_names_the_mismatched_collective(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "skip" / "stacks", tmp_path / "s")
    for f in (tmp_path / "s").glob("*.json"):
        doc = json.loads(f.read_text())
        op = "gloo:barrier" if doc["rank"] == 3 else "gloo:all_reduce"
        doc["flight_recorder"] = {"last_enqueued": {"0": 9},
                                  "entries": [{"pg_id": 0, "seq": 9, "op": op}]}
        f.write_text(json.dumps(doc))
    [f] = _findings([tmp_path])
    assert f["rule"] == "job-desync"
    assert any("#9: gloo:all_reduce on ranks 0-2; gloo:barrier on rank 3" in e for e in f["evidence"])


def test_real_gpu_ranks_are_no_stragglers_and_their_findings_name_their_rank() -> None:
    traces = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "traces"
    paths = [traces / "gpu_sampled_rank0.json.gz", traces / "gpu_sampled_rank1.json.gz"]
    if not all(p.exists() for p in paths):
        import pytest

        pytest.skip("the shared GPU traces are not here")
    report = analyze([str(p) for p in paths], jobs=1)
    assert not [f for f in report.findings if f.rule.startswith("job-")]
    per_rank = [f for f in report.findings if f.rule == "low-gpu-utilization"]
    assert sorted(f.ranks for f in per_rank) == [[0], [1]]  # type: ignore[type-var]


def test_hard_linked_traces_count_once(tmp_path: Path) -> None:
    paths = job_traces(tmp_path / "a", [2000.0, 6000.0])
    (tmp_path / "b").mkdir()
    for p in paths:
        (tmp_path / "b" / p.name).hardlink_to(p)
    report = analyze([str(tmp_path)], jobs=1)
    assert len([i for i in report.inputs if i.kind == "trace"]) == 2


def test_memory_imbalance_from_the_traces_memory_events(tmp_path: Path) -> None:
    mib = 1 << 20
    paths = job_traces(tmp_path, [2000.0] * 4, mem_bytes=[400 * mib, 410 * mib, 405 * mib, 700 * mib])
    found = _findings(paths, "job-imbalance")
    assert found and all(f["ranks"] == [3] and f["metrics"]["source"] == "trace peak" for f in found)


def test_step_time_imbalance_beyond_noise(tmp_path: Path) -> None:
    paths = job_traces(tmp_path, [2000.0] * 4, step_extra_us=[0.0, 0.0, 0.0, 1500.0])
    [f] = _findings(paths, "job-imbalance")
    assert f["ranks"] == [3] and "Step time" in f["title"]


def test_step_time_within_noise_is_not_imbalance(tmp_path: Path) -> None:
    paths = job_traces(tmp_path, [2000.0] * 4, step_extra_us=[0.0, 30.0, 10.0, 20.0])
    assert _findings(paths, "job-imbalance") == []


def test_sixty_four_ranks_name_the_one_stuck_rank(tmp_path: Path) -> None:
    stacks = {json.loads(f.read_text())["rank"]: json.loads(f.read_text())
              for f in (FIXTURES / "stuck" / "stacks").glob("*.json")}
    for r in range(64):
        doc = dict(stacks[3 if r == 17 else 0], rank=r, world_size=64)
        (tmp_path / f"stacks_rank{r}.json").write_text(json.dumps(doc))
    [f] = _findings([tmp_path])
    assert (f["rule"], f["severity"], f["ranks"]) == ("job-hang", "critical", [17])
    assert "Ranks 0-16,18-63 wait in all_reduce" in f["summary"]


def _all_waiting_same_site(tmp_path: Path, fr: dict[int, dict]) -> list[Path]:
    """Four ranks with rank 0's stacks (all in the same all_reduce line), Flight Recorder given."""
    src = json.loads((FIXTURES / "stuck" / "stacks" / "stacks_rank0.json").read_text())
    out = []
    for r in range(4):
        doc = dict(src, rank=r, flight_recorder=fr[r])
        out.append(tmp_path / f"stacks_rank{r}.json")
        out[-1].write_text(json.dumps(doc))
    return out


def test_flight_recorder_finds_the_rank_behind_when_stacks_look_alike(tmp_path: Path) -> None:
    fr = {r: {"last_enqueued": {"0": 41 if r == 1 else 42}} for r in range(4)}
    [f] = _findings(_all_waiting_same_site(tmp_path, fr))
    assert (f["rule"], f["severity"], f["ranks"]) == ("job-hang", "critical", [1])


def test_flight_recorder_finds_mismatched_sizes_when_stacks_look_alike(tmp_path: Path) -> None:
    def entry(r: int) -> dict:
        return {"pg_id": 0, "seq": 7, "op": "gloo:all_reduce",
                "input_sizes": [[8]] if r == 2 else [[4]]}
    fr = {r: {"last_enqueued": {"0": 7}, "entries": [entry(r)]} for r in range(4)}
    [f] = _findings(_all_waiting_same_site(tmp_path, fr))
    assert (f["rule"], f["ranks"]) == ("job-desync", [2])


def test_all_ranks_in_one_collective_without_more_data_is_no_finding(tmp_path: Path) -> None:
    fr = {r: {"last_enqueued": {"0": 7}} for r in range(4)}
    assert _findings(_all_waiting_same_site(tmp_path, fr)) == []
