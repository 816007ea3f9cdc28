"""Cost spread, where-the-time-goes, target parsing and the --fail-on exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flight_profiler.diagnose import stats
from flight_profiler.diagnose.model import (
    DiagnoseOptions,
    DiagnoseResult,
    MethodTarget,
    PhaseResult,
)
from flight_profiler.errors import ExitCode, FlightProfilerError, UsageError
from flight_profiler.report.models import Finding, Report


def test_spread_of_consistent_calls() -> None:
    s = stats.spread([10.0, 10.0, 11.0, 9.0])
    assert s["calls"] == 4 and s["median_ms"] == 10.0 and s["min_ms"] == 9.0 and s["max_ms"] == 11.0
    assert s["verdict"].startswith("consistent")


def test_spread_flags_outliers_before_spread() -> None:
    s = stats.spread([5.0] * 9 + [40.0])
    assert s["max_over_median"] == 8.0
    assert s["verdict"].startswith("outliers: the slowest call took 8.0x the median")
    assert s["p90_ms"] == pytest.approx(8.5)


def test_spread_says_when_too_few_or_none() -> None:
    assert stats.spread([]) == {"calls": 0, "verdict": "no calls observed"}
    assert "too few" in stats.spread([1.0, 2.0])["verdict"]


def test_cost_from_watch_events_and_variants() -> None:
    assert stats.cost_ms({"type": "call", "cost_ms": 2.5, "values": [["cost", "2.5 ms"]]}) == 2.5
    assert stats.cost_ms({"values": {"cost": 3.0}}) == 3.0
    assert stats.cost_ms({"elapsed_ns": 4_000_000}) == 4.0
    assert stats.cost_ms({"type": "watching"}) is None


def test_where_time_goes_collapses_wrapper_chains() -> None:
    tree = {"name": "step", "ms": 10.0, "children": [
        {"name": "Module.__call__", "ms": 8.0, "children": [
            {"name": "_call_impl", "ms": 7.9, "children": [
                {"name": "_hooks", "ms": 0.05},
                {"name": "forward", "ms": 7.8, "children": [
                    {"name": "linear", "ms": 5.0}, {"name": "relu", "ms": 2.0}]}]}]},
        {"name": "log", "ms": 0.05},
    ]}
    w = stats.where_time_goes(stats.call_trees([{"type": "trace", "tree": tree}] * 2))
    names = [(r["depth"], r["name"]) for r in w["top"]]
    # the three pass-through levels are one row (a tiny sibling does not stop the chain);
    # callees under 1% are left out
    assert names == [(1, "Module.__call__ > forward"), (2, "linear"), (2, "relu")]
    assert w["calls"] == 2 and w["total_ms"] == 20.0
    # the chain's row carries the figures of the callee doing the work (forward: 7.8 of 10 ms)
    assert w["top"][0]["calls"] == 2 and w["top"][0]["share_pct"] == 78.0
    assert w["self_pct"] == pytest.approx(19.5)


def test_method_target_forms() -> None:
    assert MethodTarget.parse(["train", "train_step"]) == MethodTarget("train", None, "train_step")
    t = MethodTarget.parse(["pkg.mod", "Trainer", "step"])
    assert t.words == "pkg.mod Trainer step" and t.label == "Trainer.step"
    assert MethodTarget.parse(["m", "Trainer.step"]).cls == "Trainer"
    with pytest.raises(UsageError, match="module \\[class\\] method"):
        MethodTarget.parse(["only_one"])


def _result(tmp_path: Path, severity: str | None, report: bool = True) -> DiagnoseResult:
    findings = [] if severity is None else [Finding("memory-leak", severity, "grows", "s")]
    result = DiagnoseResult(DiagnoseOptions(pid=1, out_dir=str(tmp_path)))
    result.phases.append(PhaseResult("report", "Report"))
    result.report = Report(inputs=[], findings=findings) if report else None
    result.finished = result.started + 1
    return result


@pytest.mark.parametrize(("severity", "fail_on", "code"), [
    ("warning", "warning", ExitCode.FINDINGS),
    ("critical", "warning", ExitCode.FINDINGS),
    ("info", "warning", ExitCode.OK),
    ("warning", "critical", ExitCode.OK),
    ("warning", None, ExitCode.OK),
    (None, "info", ExitCode.OK),
])
def test_fail_on_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str], severity: str | None,
                           fail_on: str | None, code: int) -> None:
    from flight_profiler.cli.diagnose_cmd import finish

    if code:
        with pytest.raises(FlightProfilerError) as exc:
            finish(_result(tmp_path, severity), fail_on, as_json=True)
        assert exc.value.exit_code == code
        assert exc.value.reported  # the JSON document said it: nothing more is printed
    else:
        finish(_result(tmp_path, severity), fail_on, as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == code
    assert len(doc["findings"]) == (0 if severity is None else 1)


def test_fail_on_without_a_report_is_not_a_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flight_profiler.cli.diagnose_cmd import finish

    with pytest.raises(FlightProfilerError) as exc:
        finish(_result(tmp_path, None, report=False), "critical", as_json=True)
    assert exc.value.exit_code == ExitCode.COMMAND_FAILED
    finish(_result(tmp_path, None, report=False), None, as_json=True)  # no --fail-on: exit 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["exit_code"] == 0
