"""GPU time breakdown vs Holistic Trace Analysis on the real traces.

HTA's figures (HTA 0.5.0, get_temporal_breakdown, HTA_DISABLE_NS_ROUNDING=1) are copied here
from /work/shared/fixtures/traces/hta_temporal_breakdown.json; HTA itself is not a dependency.
"""

from __future__ import annotations

import pytest

from flight_profiler.report import analyze
from support import TRACES

# file: (rank, idle %, compute %, non-compute %)
HTA = {
    "gpu_alexnet_sync.json.gz": (0, 99.49, 0.08, 0.43),
    "gpu_event_sync.json.gz": (0, 78.71, 18.63, 2.66),
    "gpu_sampled_rank0.json.gz": (0, 53.56, 17.71, 28.74),
    "gpu_sampled_rank1.json.gz": (1, 54.72, 22.57, 22.72),
    "gpu_train_control.json.gz": (3, 16.2, 61.23, 22.57),
    "gpu_train_test.json.gz": (1, 7.47, 68.31, 24.23),
}


@pytest.mark.parametrize("name", sorted(HTA))
def test_breakdown_matches_hta(name: str) -> None:
    rank, idle, compute, non_compute = HTA[name]
    report = analyze([str(TRACES / name)])
    (inp,) = report.inputs
    assert inp.ok, inp.error
    assert inp.rank == rank
    b = inp.data["gpu_time_breakdown"]
    assert abs(b["idle_pct"] - idle) <= 0.5
    assert abs(b["compute_pct"] - compute) <= 0.5
    assert abs(b["non_compute_pct"] - non_compute) <= 0.5
    assert abs(b["idle_pct"] + b["compute_pct"] + b["non_compute_pct"] - 100.0) < 0.01


def test_several_ranks_at_once_each_get_their_breakdown() -> None:
    report = analyze([str(TRACES / "gpu_sampled_rank0.json.gz"), str(TRACES / "gpu_sampled_rank1.json.gz")])
    ranks = {i.rank: i.data["gpu_time_breakdown"]["idle_pct"] for i in report.inputs}
    assert set(ranks) == {0, 1}
    assert abs(ranks[0] - 53.56) <= 0.5 and abs(ranks[1] - 54.72) <= 0.5


def test_cpu_only_trace_works_without_gpu_metrics() -> None:
    report = analyze([str(TRACES / "cpu_only_tiny.json.gz")])
    (inp,) = report.inputs
    assert inp.ok, inp.error
    assert inp.data["has_gpu"] is False
    assert "gpu_time_breakdown" not in inp.data
    assert inp.data["steps"]["count"] == 1
    assert not any(f.rule == "low-gpu-utilization" for f in report.findings)


@pytest.mark.slow
def test_parallel_loading_gives_the_same_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    from flight_profiler.report import engine

    files = [str(TRACES / "gpu_train_control.json.gz"), str(TRACES / "gpu_train_test.json.gz")]
    serial = analyze(files, jobs=1)
    monkeypatch.setattr(engine, "PARALLEL_MIN_BYTES", 0)
    parallel = engine.analyze(files, jobs=2)
    assert [i.data for i in parallel.inputs] == [i.data for i in serial.inputs]
    assert [f.to_dict() for f in parallel.findings] == [f.to_dict() for f in serial.findings]
