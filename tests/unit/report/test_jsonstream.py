from __future__ import annotations

import gzip
import io
import json

import pytest

from flight_profiler.report import jsonstream
from flight_profiler.report.jsonstream import TraceFormatError, iter_trace

DOC = {
    "schemaVersion": 1,
    "distributedInfo": {"rank": 3, "ranks": list(range(50))},
    "traceEvents": [{"ph": "X", "name": f"op\u00e9{i}", "ts": 1.5 * i, "dur": 12345678901234,
                     "args": {"nested": {"a": [1, 2, {"b": "x,]}"}]}}} for i in range(300)],
    "traceName": "after the events",
    "deviceProperties": [],
}


def _scan(text: str) -> tuple[list[dict], dict]:
    meta: dict = {}
    events = list(iter_trace(io.BytesIO(text.encode()), meta.__setitem__))
    return events, meta


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_same_as_json_load_at_any_chunk_size(monkeypatch: pytest.MonkeyPatch, chunk: int,
                                             indent: int | None) -> None:
    monkeypatch.setattr(jsonstream, "CHUNK", chunk)
    events, meta = _scan(json.dumps(DOC, indent=indent, ensure_ascii=False))
    assert events == DOC["traceEvents"]
    assert meta == {k: v for k, v in DOC.items() if k != "traceEvents"}


def test_bare_array_form() -> None:
    events, _ = _scan('[{"ph": "X", "ts": 1}, {"ph": "i", "ts": 2}]')
    assert [e["ts"] for e in events] == [1, 2]


def test_gzip_is_detected_by_magic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "t.json"  # no .gz extension on purpose
    with gzip.open(p, "wt") as fh:
        json.dump(DOC, fh)
    with jsonstream.open_text_bytes(str(p)) as fh:
        assert len(list(iter_trace(fh))) == 300


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("   \n", "empty"),
    ('{"traceEvents": [{"ph": "X"}, {"ph": ', "truncated"),
    ('{"traceEvents": [{"ph": "X"} {"ph": "Y"}]}', "expected"),
    ('{"schemaVersion": 1}', "no traceEvents"),
    ("hello", "not a JSON object"),
])
def test_bad_input_raises_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        _scan(text)


def test_flat_flow_events_are_skipped_and_counted() -> None:
    text = ('{"traceEvents": [{"ph": "s", "id": 1, "ts": 1, "cat": "ac2g", "name": "ac2g"},\n'
            ' {"ph": "X", "name": "k", "ts": 2, "dur": 1, "args": {"stream": 7}},\n'
            ' {"ph": "f", "id": 1, "ts": 3, "cat": "ac2g", "name": "ac2g", "bp": "e"},\n'
            ' {"ph": "f", "args": {"nested": 1}, "ts": 4}]}')
    counts: dict = {}
    events = list(iter_trace(io.BytesIO(text.encode()), None, counts))
    # the flat flows are skipped undecoded; one with a nested object is decoded normally
    assert [e["ts"] for e in events] == [2, 4]
    assert counts["skipped"] == 2
