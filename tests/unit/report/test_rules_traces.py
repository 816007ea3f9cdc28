"""Every trace rule fires on a trace showing its pattern and stays silent on a healthy one.

CPU fixtures come from real torch.profiler runs (tests/fixtures/make_fixtures.py); GPU patterns
from the real traces in ../shared and from schema-faithful synthetic traces (report_synth).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from report_synth import gpu_trace

from flight_profiler.report import Report, analyze
from support import TRACES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"


def _rules(report: Report, rule: str) -> list:  # type: ignore[type-arg]
    return [f for f in report.findings if f.rule == rule]


@pytest.fixture(scope="module")
def healthy_gpu(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return analyze([str(gpu_trace(tmp_path_factory.mktemp("g") / "healthy.json.gz"))])


@pytest.fixture(scope="module")
def healthy_cpu() -> Report:
    return analyze([str(FIXTURES / "cpu_healthy.json.gz")])


PROBLEMS = ("memory-leak", "graph-retention", "oom", "fragmentation", "transfer-bottleneck",
            "sync-bottleneck", "launch-overhead", "dataloader-bottleneck", "low-gpu-utilization")


@pytest.mark.parametrize("rule", PROBLEMS)
def test_healthy_traces_raise_no_problem(rule: str, healthy_gpu: Report, healthy_cpu: Report) -> None:
    assert _rules(healthy_gpu, rule) == []
    assert _rules(healthy_cpu, rule) == []


def test_healthy_gpu_trace_is_really_busy(healthy_gpu: Report) -> None:
    assert healthy_gpu.inputs[0].data["gpu_time_breakdown"]["busy_pct"] > 90


def test_memory_leak_from_a_real_cpu_run() -> None:
    report = analyze([str(FIXTURES / "cpu_leak.json.gz")])
    (f,) = _rules(report, "memory-leak")
    assert f.severity in ("warning", "critical")
    assert 1.9 * 2**20 < f.metrics["slope_bytes_per_step"] < 2.2 * 2**20  # the 2 MiB/step cache
    assert any("make_fixtures.py" in w for w in f.where)  # names the leaking line


def test_memory_leak_from_gpu_memory_events(tmp_path: Path) -> None:
    report = analyze([str(gpu_trace(tmp_path / "leak.json.gz", mem_growth_per_step=64 << 20))])
    (f,) = _rules(report, "memory-leak")
    assert f.metrics["device"] == "cuda:0"
    assert any("model.py:100" in w for w in f.where)


def test_dataloader_bottleneck_from_a_real_cpu_run() -> None:
    report = analyze([str(FIXTURES / "cpu_dataloader.json.gz")])
    (f,) = _rules(report, "dataloader-bottleneck")
    assert f.severity == "critical" and f.metrics["pct_of_window"] > 50
    assert any("num_workers" in fix for fix in f.fix)
    assert "make_fixtures.py:" in f.where[0] and "(step)" in f.where[0]  # the `next(it)` line


def test_dataloader_share_between_thresholds_is_a_warning(tmp_path: Path) -> None:
    # 40 kernels x 200 us = 8 ms of step; 1400 us of DataLoader ~ 15 %
    # the step ends with loss.item(), which waits for the GPU: the step lasts ~9.5 ms
    report = analyze([str(gpu_trace(tmp_path / "dl.json.gz", dataloader_us=1400, sync_wait_us=1))])
    (f,) = _rules(report, "dataloader-bottleneck")
    assert f.severity == "warning" and 11.5 < f.metrics["pct_of_window"] < 17
    # 800 us ~ 9 %: what healthy loaders measure (5-10 %, issue 18): reported, as info
    report = analyze([str(gpu_trace(tmp_path / "dl9.json.gz", dataloader_us=800, sync_wait_us=1))])
    (g,) = _rules(report, "dataloader-bottleneck")
    assert g.severity == "info" and 5 < g.metrics["pct_of_window"] < 10


def test_launch_overhead_on_cpu_from_a_real_run_of_tiny_ops() -> None:
    report = analyze([str(FIXTURES / "cpu_tiny_ops.json.gz")])
    (f,) = _rules(report, "launch-overhead")
    assert f.metrics["tiny_calls_pct"] > 90
    assert any("torch.compile" in fix for fix in f.fix)
    # the loop line `x = x * 1.0001 + 0.001`, through its aten::mul / aten::add
    assert any("make_fixtures.py:" in w and ("aten::add" in w or "aten::mul" in w) for w in f.where)


def test_launch_overhead_on_gpu(tmp_path: Path) -> None:
    p = gpu_trace(tmp_path / "short.json.gz", kernels_per_step=100, kernel_us=3, launch_gap_us=10)
    (f,) = _rules(analyze([str(p)]), "launch-overhead")
    assert f.metrics["short_pct"] == 100.0 and f.metrics["idle_pct"] > 15
    assert "model.py:100" in f.where[0] and "aten::mul" in f.where[0]


def test_sync_bottleneck_names_the_python_line(tmp_path: Path) -> None:
    p = gpu_trace(tmp_path / "sync.json.gz", sync_wait_us=3000)
    (f,) = _rules(analyze([str(p)]), "sync-bottleneck")
    assert any("train.py:57" in w and "aten::item" in w for w in f.where)
    assert f.metrics["gpu_idle_after_sync_us"] > 0


def test_sync_bottleneck_on_a_real_gpu_trace_costs_only_the_idle_it_causes() -> None:
    # The CPU waits 28 % of the step in .item(), but the GPU stays busy through the waits:
    # the GPU-bound state, not a bottleneck (issue 12).
    report = analyze([str(TRACES / "gpu_train_test.json.gz")])
    (f,) = _rules(report, "sync-bottleneck")
    assert f.metrics["pct_of_window"] > 20
    assert f.severity == "info" and f.cost is not None and f.cost.pct < 1
    assert f.cost.us == f.metrics["gpu_idle_caused_us"] < 0.01 * f.metrics["blocked_us"]
    assert any("aten::item" in w for w in f.where)


def test_transfer_bottleneck_pageable_copies_name_the_line(tmp_path: Path) -> None:
    p = gpu_trace(tmp_path / "copy.json.gz", copy_bytes=64 << 20, copy_us=1500)
    (f,) = _rules(analyze([str(p)]), "transfer-bottleneck")
    assert f.severity == "warning"  # 1.5 ms of copy + 8 ms of kernels per step: 16 % of busy
    assert any("train.py:41" in w for w in f.where)
    assert any("pin_memory" in fix for fix in f.fix)


def test_transfer_on_real_alexnet_trace_is_most_of_a_tiny_busy_time() -> None:
    # Copies are 84 % of GPU busy time, but the GPU is busy 0.5 % of a 13 s span: pinning the
    # pageable copies is worth saying, yet recovers under 1 % of GPU time (issue 12).
    (f,) = _rules(analyze([str(TRACES / "gpu_alexnet_sync.json.gz")]), "transfer-bottleneck")
    assert f.metrics["pct_of_gpu_busy"] > 80 and f.metrics["pageable_bytes"] > 0
    assert f.severity == "info" and f.cost is not None and f.cost.pct < 1
    assert any("pin_memory" in fix for fix in f.fix)


def test_pinned_small_copies_stay_silent(tmp_path: Path) -> None:
    p = gpu_trace(tmp_path / "pinned.json.gz", copy_bytes=1 << 10, copy_us=5, copy_kind="Pinned")
    assert _rules(analyze([str(p)]), "transfer-bottleneck") == []


def test_low_gpu_utilization_real_traces() -> None:
    report = analyze([str(TRACES / "gpu_alexnet_sync.json.gz"), str(TRACES / "gpu_train_control.json.gz")])
    found = _rules(report, "low-gpu-utilization")
    assert [Path(f.inputs[0]).name for f in found] == ["gpu_alexnet_sync.json.gz"]
    assert found[0].severity == "critical"
    # the longest idle gap: 10 s while the CPU ran cudnn_convolution (benchmark mode autotuning)
    assert found[0].where[0].startswith("idle 10.03 s") and "cudnn_convolution" in found[0].where[0]


def test_hot_operators_table_is_info() -> None:
    report = analyze([str(FIXTURES / "cpu_healthy.json.gz")])
    (f,) = _rules(report, "hot-operators")
    assert f.severity == "info"
    ops = f.metrics["top_operators"]
    assert ops[0]["name"] in ("aten::mm", "aten::addmm")
    assert all(a["self_us"] >= b["self_us"] for a, b in zip(ops, ops[1:]))


def test_launch_overhead_cpu_fires_on_share_of_operator_time_when_the_window_is_inflated() -> None:
    # GIVEN operator figures where tiny ops are 8 % of a (contention-inflated) window but 70 % of
    # all operator self time, WHEN the rule runs, THEN it fires; with 2 % of the window it stays
    # silent (a DataLoader-bound step whose few ops happen to be tiny).
    from flight_profiler.report.rules import launch_overhead

    class _Trace:
        path = "t.json"
        name = "t.json"
        kind = "trace"
        rank = None

        def __init__(self, window_pct: float) -> None:
            self.data = {"has_gpu": False, "window_kind": "step", "top_operators": [],
                         "operators": {"calls": 5000, "distinct": 3, "tiny_calls": 4900,
                                       "tiny_calls_pct": 98.0, "tiny_self_us": 1000.0,
                                       "tiny_self_pct_of_window": window_pct,
                                       "tiny_self_pct_of_ops": 70.0, "tiny_callers": []}}

    class _Ctx:
        def __init__(self, window_pct: float) -> None:
            self.traces = [_Trace(window_pct)]

    assert [f.rule for f in launch_overhead.check(_Ctx(8.0))] == ["launch-overhead"]  # type: ignore[arg-type]
    assert launch_overhead.check(_Ctx(2.0)) == []  # type: ignore[arg-type]


def test_a_borderline_cpu_share_is_info_not_a_warning() -> None:
    # Measured on a loaded 2-core machine: a small healthy MLP loop swung to 13 % of the window
    # and 37 % of operator self time in 1 run of 5 (2-6 % in the others). Such a run must not
    # warn; a clear case (the tiny-ops fixture, 72 % of operator time) still does.
    from flight_profiler.report.rules import launch_overhead

    class _Trace:
        path = name = "t.json"
        kind = "trace"
        rank = None

        def __init__(self, window_pct: float, ops_pct: float, per_step: float) -> None:
            # the window such that the tiny operators' self time is `window_pct` of it
            self.data = {"has_gpu": False, "window_kind": "steps", "top_operators": [],
                         "window_us": 900.0 * 100.0 / window_pct,
                         "operators": {"calls": 1100, "distinct": 20, "tiny_calls": 1060,
                                       "tiny_calls_pct": 96.5, "tiny_self_us": 900.0,
                                       "tiny_self_pct_of_window": window_pct,
                                       "tiny_self_pct_of_ops": ops_pct, "tiny_callers": [],
                                       "per_step": per_step}}

    class _Ctx:
        def __init__(self, window_pct: float, ops_pct: float, per_step: float = 60.0) -> None:
            self.traces = [_Trace(window_pct, ops_pct, per_step)]

    (borderline,) = launch_overhead.check(_Ctx(12.9, 37.1))  # type: ignore[arg-type]
    assert borderline.severity == "info" and "borderline" in borderline.title
    # a clear case: severity follows the cost (31 % of step time: critical, issue 12)
    assert [f.severity for f in launch_overhead.check(_Ctx(31.0, 44.0))] == ["critical"]  # type: ignore[arg-type]
    # The planted tiny-ops loop under diagnose on a loaded machine: borderline shares, but 1140
    # operator calls per step: the count, which load does not move, makes it count (16 %: warning)
    assert [f.severity for f in launch_overhead.check(_Ctx(16.4, 34.3, 1140.0))] == ["warning"]  # type: ignore[arg-type]
    report = analyze([str(FIXTURES / "cpu_tiny_ops.json.gz")])
    assert [f.severity for f in _rules(report, "launch-overhead")] in (["warning"], ["critical"])


def test_many_python_issued_tiny_ops_with_no_cost_are_not_a_warning() -> None:
    # Measured on pytorch/examples' actor-critic (one environment step at a time): ~370 tiny
    # operators a step issued from Python, 1.1 % of the step time, and 55 % of it in tiny
    # operators inside the model's own layers and backward. A count alone made it a warning on a
    # healthy tutorial program; what the fix recovers is 1 %: info. The tiny-ops loop (260 a
    # step, 16 % of the window) still warns.
    from flight_profiler.report.rules import launch_overhead

    class _Trace:
        path = name = "t.json"
        kind = "trace"
        rank = None

        def __init__(self, python_pct: float, python_calls: int) -> None:
            self.data = {"has_gpu": False, "window_kind": "steps", "top_operators": [],
                         "window_us": 4.9e6, "steps": {"count": 50},
                         "operators": {"calls": 2377440, "distinct": 127, "tiny_calls": 2370298,
                                       "tiny_calls_pct": 99.7, "tiny_self_us": 2.67e6,
                                       "tiny_self_pct_of_window": 54.7,
                                       "tiny_self_pct_of_ops": 95.7, "tiny_callers": [],
                                       "from_python_tiny_calls": python_calls,
                                       "from_python_tiny_us": 4.9e6 * python_pct / 100,
                                       "from_python_tiny_pct_of_window": python_pct}}

    class _Ctx:
        def __init__(self, python_pct: float, python_calls: int) -> None:
            self.traces = [_Trace(python_pct, python_calls)]

    (quiet,) = launch_overhead.check(_Ctx(1.1, 18676))  # type: ignore[arg-type]
    assert quiet.severity == "info"
    assert "inside library operators" in quiet.title
    (loop,) = launch_overhead.check(_Ctx(6.0, 13000))  # type: ignore[arg-type]
    assert loop.severity == "warning"  # 260 a step, over the floor: the count makes it count


def _loop_of_tiny_ops(path: Path, slow_share: float) -> Path:
    """A CPU trace of 6 steps, each 260 operators issued one by one from Python (the tiny-ops
    sample's recurrence), ``slow_share`` of them at 12 us (past the 10 us line, as a slower or
    busier machine makes `state * 0.9`), the rest at 5 us, then 6 ms of model compute."""
    import gzip
    import json

    events: list[dict[str, object]] = []
    ts = 1_000_000.0
    slow_every = round(1 / slow_share) if slow_share else 0
    for step in range(6):
        start = ts
        for i in range(260):
            dur = 12.0 if slow_every and i % slow_every == 0 else 5.0
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1,
                           "ts": ts, "dur": dur, "args": {}})
            ts += dur + 1.0
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1,
                       "ts": ts, "dur": 6000.0, "args": {}})
        ts += 6001.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": 1, "tid": 1, "ts": start - 0.5, "dur": ts - start, "args": {}})
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    return path


def test_a_loop_of_tiny_ops_is_counted_whatever_the_machines_speed(tmp_path: Path) -> None:
    # CI on a slower machine: `state * 0.9` took 10-15 us on some runs, so 773 of the sample's
    # 1300 a window counted as tiny (155 a step, under the 200 of a warning) and the planted
    # loop was info. Counted under twice the line, the loop is the same loop on any machine.
    for slow_share in (0.0, 0.5):
        report = analyze([str(_loop_of_tiny_ops(tmp_path / f"t{slow_share}.json.gz", slow_share))])
        ops = report.inputs[0].data["operators"]
        assert ops["from_python_small_calls"] == 6 * 260
        assert ops["from_python_tiny_calls"] == 6 * 260 * (1 - slow_share)
        (finding,) = _rules(report, "launch-overhead")
        assert finding.severity in ("warning", "critical"), (slow_share, finding)
