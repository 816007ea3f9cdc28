"""One job report from per-node directories (report/job_merge.py, `report DIR1 DIR2` and
`report PARENT`): node directories made from the recorded stack files of real 4-rank torchrun
jobs (tests/fixtures/ranks), split in two nodes of two ranks as diagnose --all-ranks writes them
on each node."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.errors import BadInputFile, UsageError
from flight_profiler.report.job_merge import merge_node_dirs, merged_report, node_dirs

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ranks"
JOB = {"run_id": "job-a", "master": "127.0.0.1:29400", "slurm_job_id": None, "world_size": 4}


def node_dir(out: Path, case: str, node: int, ranks: list[int], job: dict[str, Any] | None = None,
             host: str = "box") -> Path:
    """What `diagnose LAUNCHER --all-ranks --out OUT` writes on one node: stacks/ and
    diagnose_job.json with the node's identity."""
    (out / "stacks").mkdir(parents=True)
    for r in ranks:
        doc = json.loads((FIXTURES / case / "stacks" / f"stacks_rank{r}.json").read_text())
        doc["node"] = {"node_rank": node, "hostname": host}
        (out / "stacks" / f"stacks_rank{r}.json").write_text(json.dumps(doc))
    ident = {**(job or JOB), "node_rank": node, "hostname": host}
    (out / "diagnose_job.json").write_text(json.dumps({
        "format": "flight_profiler.diagnose_job", "version": 1, "job": ident,
        "ranks": {str(r): {"pid": 100 + r, "rank": r, "local_rank": r % 2, "node_rank": node,
                           "hostname": host, "world_size": 4} for r in ranks}}))
    return out


def two_nodes(tmp_path: Path, case: str) -> tuple[Path, Path]:
    return (node_dir(tmp_path / "out" / "node0", case, 0, [0, 1]),
            node_dir(tmp_path / "out" / "node1", case, 1, [2, 3]))


def job_findings(report: Any) -> list[Any]:
    return [f for f in report.findings if f.rule.startswith("job-")]


def test_a_hang_on_node_1_is_named_by_global_rank_and_node(tmp_path: Path) -> None:
    # The recorded job: rank 3 stuck outside the all_reduce ranks 0-2 wait in.
    n0, n1 = two_nodes(tmp_path, "stuck")
    [f] = job_findings(merged_report(merge_node_dirs([str(n0), str(n1)]), jobs=1))
    assert (f.rule, f.severity, f.ranks) == ("job-hang", "critical", [3])
    assert "rank 3 on node 1 (box)" in f.title
    assert f.metrics["nodes"] == {"3": {"node_rank": 1, "hostname": "box"}}


def test_each_node_alone_cannot_see_it_the_merge_does(tmp_path: Path) -> None:
    n0, _ = two_nodes(tmp_path, "stuck")
    # node 0 alone: both its ranks wait, the culprit is elsewhere; only the missing ranks are named
    [f] = job_findings(merged_report(merge_node_dirs([str(n0)]), jobs=1))
    assert (f.rule, f.severity, f.ranks) == ("job-hang", "warning", [2, 3])
    assert any("in no node directory" in e for e in f.evidence)


def test_the_parent_form_is_the_same_merge(tmp_path: Path) -> None:
    n0, n1 = two_nodes(tmp_path, "skip")
    assert node_dirs([str(tmp_path / "out")]) == [str(n0), str(n1)]
    assert node_dirs([str(n0)]) is None  # one node's directory: the single-node form
    [f] = job_findings(merged_report(merge_node_dirs(node_dirs([str(tmp_path / "out")]) or []), jobs=1))
    assert (f.rule, f.ranks) == ("job-desync", [3]) and "node 1" in f.title


def test_ranks_in_no_directory_are_named_missing(tmp_path: Path) -> None:
    n0 = node_dir(tmp_path / "node0", "healthy", 0, [0, 1])
    merged = merge_node_dirs([str(n0)])
    assert merged.missing == [2, 3]
    report = merged_report(merged, jobs=1)
    assert report.job is not None and report.job["missing_ranks"] == [2, 3]


def test_directories_of_two_jobs_are_refused_naming_both(tmp_path: Path) -> None:
    n0 = node_dir(tmp_path / "a", "healthy", 0, [0, 1])
    n1 = node_dir(tmp_path / "b", "healthy", 1, [2, 3], job={**JOB, "run_id": "job-b"})
    with pytest.raises(UsageError, match=r"two different jobs.*run_id=job-a.*run_id=job-b") as err:
        merge_node_dirs([str(n0), str(n1)])
    assert err.value.exit_code == 2


def test_the_same_rank_in_two_directories_is_refused(tmp_path: Path) -> None:
    n0 = node_dir(tmp_path / "a", "healthy", 0, [0, 1])
    again = node_dir(tmp_path / "b", "healthy", 0, [1, 2])
    with pytest.raises(UsageError, match=r"rank\(s\) 1 are in both"):
        merge_node_dirs([str(n0), str(again)])
    assert merge_node_dirs([str(n0), str(n0)]).nodes[0].ranks == [0, 1]  # one directory twice: once


def test_a_corrupt_node_directory_is_skipped_and_its_ranks_missing(tmp_path: Path) -> None:
    n0, n1 = two_nodes(tmp_path, "healthy")
    (n1 / "diagnose_job.json").write_bytes(b"\x00{not json")
    merged = merge_node_dirs([str(n0), str(n1)])
    assert [n.path for n in merged.nodes] == [str(n0)] and merged.missing == [2, 3]
    assert "not valid JSON" in merged.skipped[0][1]
    (n0 / "diagnose_job.json").write_text('{"format": "flight_profiler.diagnose_job", "ranks": []}')
    with pytest.raises(BadInputFile, match="no node directory could be read"):
        merge_node_dirs([str(n0), str(n1)])


def test_a_link_in_place_of_diagnose_job_json_is_not_followed(tmp_path: Path) -> None:
    n0, n1 = two_nodes(tmp_path, "healthy")
    (n1 / "diagnose_job.json").unlink()
    (n1 / "diagnose_job.json").symlink_to(n0 / "diagnose_job.json")
    merged = merge_node_dirs([str(n0), str(n1)])
    assert [n.path for n in merged.nodes] == [str(n0)] and merged.skipped


def test_flight_recorder_enqueue_times_are_not_compared_across_nodes(tmp_path: Path) -> None:
    # Node 1's clock runs 5 s ahead: by wall clock its ranks would enqueue every collective
    # last. Within each node, rank 1 is 30 ms late in every collective: the real straggler.
    def fr(r: int) -> dict[str, Any]:
        skew = 5_000_000_000 if r >= 2 else 0
        late = 30_000_000 if r == 1 else 0
        return {"last_enqueued": {"0": 9}, "entries": [
            {"pg_id": 0, "seq": s, "op": "gloo:all_reduce",
             "created_ns": 10**18 + s * 10**8 + skew + late + r} for s in range(1, 9)]}
    for node, ranks in ((0, [0, 1]), (1, [2, 3])):
        d = node_dir(tmp_path / f"node{node}", "stuck", node, ranks)
        for r in ranks:
            p = d / "stacks" / f"stacks_rank{r}.json"
            doc = json.loads(p.read_text())
            src = json.loads((FIXTURES / "stuck" / "stacks" / "stacks_rank0.json").read_text())
            doc.update(samples=src["samples"], flight_recorder=fr(r))  # all in one all_reduce
            p.write_text(json.dumps(doc))
    merged = merge_node_dirs([str(tmp_path / "node0"), str(tmp_path / "node1")])
    [f] = job_findings(merged_report(merged, jobs=1))
    assert (f.rule, f.ranks) == ("job-straggler", [1]), f.title
    assert "rank 1 on node 0" in f.title
    assert any("within each node" in e for e in f.evidence)


def test_report_cli_merges_and_refuses_two_jobs_with_one_line(tmp_path: Path) -> None:
    n0, n1 = two_nodes(tmp_path, "stuck")
    cli = [sys.executable, "-m", "flight_profiler", "report", "--json"]
    done = subprocess.run([*cli, str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    doc = json.loads(done.stdout)
    assert [n["node_rank"] for n in doc["job"]["nodes"]] == [0, 1]
    assert any(f["rule"] == "job-hang" and f["ranks"] == [3] for f in doc["findings"])
    other = node_dir(tmp_path / "other", "healthy", 1, [2, 3], job={**JOB, "run_id": "job-z"})
    shutil.rmtree(n1)
    bad = subprocess.run([*cli[:-1], str(n0), str(other)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "job-a" in bad.stderr and "job-z" in bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if ln.strip()]) <= 2, bad.stderr
