"""The msgspec batch decoder gives exactly the events (and figures) of the stdlib path, on
real traces and on layouts that trip naive splitting (issue 12)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.report import fastjson, trace_loader
from flight_profiler.report.fastjson import NeedStdlib, iter_batches
from flight_profiler.report.trace_metrics import trace_metrics
from support import TRACES


def _fast(data: bytes) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    meta: dict[str, Any] = {}
    out = [(e.ph, e.cat, e.name, e.ts, e.dur, e.args.correlation if e.args else None)
           for b in iter_batches(io.BytesIO(data), meta.__setitem__) for e in b]
    return out, meta


def _expected(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e.get("ph", ""), e.get("cat", ""), e.get("name", ""), float(e["ts"]) if "ts" in e else None,
             float(e.get("dur", 0.0)), (e.get("args") or {}).get("correlation"))
            for e in doc["traceEvents"]]


def _same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:3] == w[:3] and g[4:] == w[4:]
        assert (w[3] is None and g[3] != g[3]) or g[3] == w[3]  # missing ts -> NaN


EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "weird },{ name }] here", "pid": 1, "tid": 1, "ts": 1.5,
     "dur": 2, "args": {"Input Dims": [[1, 2], []], "list of dicts": [{"a": 1}, {"b": [{}]}]}},
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3, "dur": 1,
     "args": {"stream": 7, "correlation": 9, "device": 0}},
    {"ph": "f", "id": 3, "pid": 0, "tid": 7, "ts": 3},
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "x"}},
]


@pytest.mark.parametrize("layout", ["torch", "compact", "events-last", "meta-after", "one-per-line"])
def test_layouts_decode_exactly(layout: str) -> None:
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0}, {"id": 1}]}
    if layout == "events-last":
        doc = {**doc, "traceName": "t", "traceEvents": EVENTS * 50}
    elif layout == "meta-after":
        doc = {"traceEvents": EVENTS * 50, **doc, "traceName": "t"}
    else:
        doc = {**doc, "traceEvents": EVENTS * 50, "traceName": "t"}
    if layout == "compact":
        text = json.dumps(doc, separators=(",", ":"))
    elif layout == "one-per-line":
        text = json.dumps(doc, indent=1)
    else:
        text = json.dumps(doc, indent=2)
    got, meta = _fast(text.encode())
    _same(got, _expected(doc))
    assert meta["deviceProperties"] == [{"id": 0}, {"id": 1}] and meta["schemaVersion"] == 1


def test_small_windows_cut_a_real_trace_into_many_batches_without_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    data = gzip.decompress((TRACES / "gpu_sampled_rank0.json.gz").read_bytes())
    monkeypatch.setattr(fastjson, "WINDOW", 4096)
    batches = list(iter_batches(io.BytesIO(data)))
    assert len(batches) > 100
    got = [(e.ph, e.cat, e.name, e.ts, e.dur, e.args.correlation if e.args else None)
           for b in batches for e in b]
    _same(got, _expected(json.loads(data)))


@pytest.mark.parametrize("text", [
    '[{"ph": "X", "ts": 1}]',  # the bare-array form
    '{"traceEvents": [{"ph": "X", "name": 5, "ts": 1}]}',  # a name that is not a string
    '{"traceEvents": [{"ph": "X", "ts": "12"}]}',  # a time as a string
    '{"traceEvents": [{"ph": "X", "ts": NaN}]}',
    '{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": ',  # truncated
])
def test_unusual_or_malformed_files_go_to_the_stdlib_path(text: str) -> None:
    with pytest.raises(NeedStdlib):
        _fast(text.encode())


def test_the_stdlib_path_gives_the_same_figures_as_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(TRACES / "gpu_train_test.json.gz")
    fast = trace_metrics(trace_loader.load_trace(path))

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise NeedStdlib("forced")

    monkeypatch.setattr(trace_loader, "iter_batches", refuse)
    slow = trace_metrics(trace_loader.load_trace(path))
    assert json.dumps(fast, sort_keys=True, default=str) == json.dumps(slow, sort_keys=True, default=str)


def test_the_stdlib_path_reads_what_the_fast_path_refuses(tmp_path: Path) -> None:
    p = tmp_path / "bare.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                              "ts": 10, "dur": 5}]))
    raw = trace_loader.load_trace(str(p))
    assert raw.events == 1 and len(raw.threads) == 1


def test_gzip_is_inflated_ahead_and_a_cut_gzip_is_one_clear_error(tmp_path: Path) -> None:
    from flight_profiler.report.readahead import ReadAhead

    data = (TRACES / "gpu_sampled_rank0.json.gz").read_bytes()
    with gzip.open(io.BytesIO(data)) as g, ReadAhead(g, chunk=1000) as ra:
        assert b"".join(iter(lambda: ra.read(777), b"")) == gzip.decompress(data)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    from flight_profiler.report.jsonstream import TraceFormatError

    with pytest.raises(TraceFormatError, match=r"decompress|truncated"):
        trace_loader.load_trace(str(cut))
