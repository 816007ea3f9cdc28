"""job-straggler with a rank that only ran slower (a busy host) beside the real straggler: the
2-node c10d run where rank 3, on the other "node" of a loaded 2-core box, waited 59 % of its
window against its node's 92 %, with no more work than the others, and was named a straggler
beside rank 1, which sleeps 40 ms a step in its logging call."""

from __future__ import annotations

from typing import Any

from flight_profiler.report.models import InputResult
from flight_profiler.report.rules import Context
from flight_profiler.report.rules.job_fr import FlightRecorder
from flight_profiler.report.rules.job_waits import rank_figures, straggler_findings

STEP_US = 90_000.0
STEPS = 20


def _trace(rank: int, wait: float, sleep: float = 0.0, other: float = 0.04, ops: int = 400) -> InputResult:
    window = STEP_US * STEPS
    compute = max(0.0, 1.0 - wait - sleep - other)
    work = {"window_us": window, "wait_us": wait * window, "compute_us": compute * window,
            "data_us": 0.0, "sleep_us": sleep * window, "blocked_us": 0.0,
            "other_us": other * window, "python_frames": True, "window_kind": "profile",
            "ddp": True, "steps": STEPS, "ops": ops * STEPS,
            "lines": ([{"kind": "sleep", "where": "ddp_trainer.py:69 (log_metrics)",
                        "pct": 100.0 * sleep}] if sleep else [])}
    data: dict[str, Any] = {"distributed": {"span_us": window, "compute_us": compute * window,
                                            "collective_us": wait * window, "work": work},
                            "top_operators": [{"name": "aten::addmm", "self_us": 1000.0}]}
    return InputResult(f"/x/rank{rank}/profile.json.gz", "trace", True, data=data, rank=rank)


def _findings(traces: list[InputResult]) -> list[Any]:
    ctx = Context(traces=traces)
    return straggler_findings(ctx, rank_figures(traces), FlightRecorder(), None)


def test_a_rank_that_only_runs_slower_is_not_named_beside_the_straggler() -> None:
    traces = [_trace(0, 0.92), _trace(1, 0.50, sleep=0.44), _trace(2, 0.92),
              _trace(3, 0.59, other=0.37)]
    [f] = _findings(traces)
    assert f.rule == "job-straggler" and f.severity == "warning" and f.ranks == [1], f.title
    assert f.metrics["cause"] == "sleep" and "log_metrics" in f.title
    assert any(e.startswith("rank 3 also waits less") for e in f.evidence), f.evidence


def test_a_slow_rank_with_work_of_its_own_is_still_named() -> None:
    # rank 3 runs twice the operators of the others: extra work, a straggler too
    traces = [_trace(0, 0.92), _trace(1, 0.50, sleep=0.44), _trace(2, 0.92),
              _trace(3, 0.59, other=0.37, ops=800)]
    [f] = _findings(traces)
    assert f.ranks == [1, 3], f.title
