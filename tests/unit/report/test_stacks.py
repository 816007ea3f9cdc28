"""Nesting per thread: callers at a point in time and operators' self time, out-of-order input."""

from __future__ import annotations

import json
from pathlib import Path

from flight_profiler.report.stacks import CallerIndex, operator_self_times
from flight_profiler.report.trace_loader import load_trace


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:  # type: ignore[type-arg]
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_callers_and_self_time_with_events_out_of_order(tmp_path: Path) -> None:
    events = [
        _x("cpu_op", "aten::b", 20, 10),                         # child written before parent
        _x("python_function", "train.py(10): step", 0, 100),
        _x("python_function", "site-packages/torch/x.py(5): f", 21, 8),
        _x("cpu_op", "aten::a", 10, 40),
        _x("cpu_op", "aten::c", 60, 5),
        _x("cpu_op", "aten::a", 70, 4, tid=2),                  # another thread
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    raw = load_trace(str(p))
    key1 = next(k for k in raw.threads if len(raw.threads[k].ts) == 5)
    index = CallerIndex(raw)
    at = dict(zip(["in b", "in a only", "in c", "after", "before"],
                  index.resolve([(key1, 25), (key1, 45), (key1, 62), (key1, 200), (key1, -1)])))
    assert at["in b"] == ("train.py:10 (step)", ["aten::a", "aten::b"])
    assert at["in a only"] == ("train.py:10 (step)", ["aten::a"])
    assert at["in c"] == ("train.py:10 (step)", ["aten::c"])
    assert at["after"] == (None, []) and at["before"] == (None, [])
    stats, _ = operator_self_times(raw)
    assert stats["aten::a"] == [2, 44.0, 34.0]  # 40 - 10 (aten::b) + 4 on thread 2
    assert stats["aten::b"] == [1, 10.0, 10.0]
