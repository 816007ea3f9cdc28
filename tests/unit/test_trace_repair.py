"""torch's export writes some names unescaped (agent/trace_repair.py): the mending of such lines,
whole and streamed, and that everything else passes through byte for byte."""

from __future__ import annotations

import io
import json
import random

import pytest

from flight_profiler.agent.trace_repair import MAX_LINE, Mender, MendingReader, mend

# the line torch 2.13 wrote with with_stack over a loop whose optimizer imported torch._dynamo,
# and the one it writes for a function whose name holds quotes (tests/integration)
BROKEN = [b'    "name": "torch/_dynamo/polyfills/struct.py(0): "",\n',
          b'    "name": "quote.py(2): say "hi"/now",\n']


def _trace(lines: list[bytes]) -> bytes:
    events = []
    for i, line in enumerate(lines):
        events.append(b'  {\n    "ph": "X",\n    "cat": "python_function",\n' + line
                      + b'    "pid": 1,\n    "tid": 1,\n    "ts": ' + str(i).encode() + b',\n    "dur": 1\n  }')
    return b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + b",\n".join(events) + b'\n]}\n'


def test_a_name_torch_wrote_unescaped_is_escaped_and_nothing_else_changes():
    good = b'    "name": "aten::mm",\n'
    text = _trace([good, *BROKEN, good])
    with pytest.raises(ValueError):
        json.loads(text)
    out, mended = mend(text)
    assert mended == 2
    names = [e["name"] for e in json.loads(out)["traceEvents"]]
    assert names == ["aten::mm", 'torch/_dynamo/polyfills/struct.py(0): "', 'quote.py(2): say "hi"/now', "aten::mm"]
    assert out.replace(b'\\"', b'"') == text  # only the added escapes differ


def test_valid_json_comes_out_identical_escapes_included():
    text = json.dumps({"traceEvents": [{"name": 'a "quoted" \\ name\twith\ttabs', "args": {"x": "}\"]:"}},
                                       {"name": "C:\\path\\file.py(3): f"}]}, indent=2).encode()
    assert mend(text) == (text, 0)
    compact = json.dumps({"traceEvents": [{"name": 'q"'}] * 1000}).encode()  # one long line
    assert mend(compact) == (compact, 0)


@pytest.mark.parametrize("raw,expected", [
    (b'  "name": "C:\\work\\x.py(3): f",\n', "C:\\work\\x.py(3): f"),  # a raw backslash
    (b'  "name": "tab\there",\n', "tab\there"),  # a raw control character
])
def test_other_raw_names_are_escaped_too(raw, expected):
    text = b"{\n" + raw.rstrip(b",\n") + b"\n}\n"
    out, mended = mend(text)
    assert mended == 1 and json.loads(out)["name"] == expected


def test_streamed_in_any_blocks_it_mends_the_same():
    text = _trace([b'    "name": "aten::add",\n', *BROKEN] * 50)
    whole, mended = mend(text)
    rnd = random.Random(7)
    for _ in range(20):
        cuts = sorted(rnd.sample(range(1, len(text)), 12))
        blocks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        mender = Mender()
        assert b"".join(mender.blocks(blocks)) == whole and mender.mended == mended == 100
    reader = MendingReader(io.BytesIO(text))
    got = b""
    while True:
        chunk = reader.read(777)
        if not chunk:
            break
        got += chunk
    assert got == whole and reader.mended == 100


def test_a_line_longer_than_the_bound_passes_through_and_is_never_held_whole():
    long_line = b'  "name": "' + b"x" * (MAX_LINE + 10) + b'"",\n'
    text = b"{\n" + long_line + BROKEN[0] + b"}\n"
    mender = Mender()
    out = []
    for i in range(0, len(text), 4096):
        out.append(mender.feed(text[i:i + 4096]))
        assert len(mender._tail) <= MAX_LINE + 4096
    out.append(mender.finish())
    joined = b"".join(out)
    assert joined.startswith(b"{\n" + long_line) and mender.mended == 1
    assert joined.endswith(b'    "name": "torch/_dynamo/polyfills/struct.py(0): \\"",\n}\n')


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_the_report_reads_a_trace_torch_exported_broken_and_says_so(tmp_path, suffix):
    import gzip

    from flight_profiler.report.trace_loader import load_trace
    from flight_profiler.report.trace_metrics import loader_notes

    text = _trace([b'    "name": "aten::mm",\n', *BROKEN])
    path = tmp_path / f"torch{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    raw = load_trace(str(path))
    assert raw.events == 3 and raw.mended == 2
    assert 'quote.py(2): say "hi"/now' in raw.names
    assert any("2 line(s) of the file were not valid JSON" in n for n in loader_notes(raw))


def test_the_byte_scan_runs_only_on_text_holding_such_a_byte(monkeypatch):
    # Regex-scanning every byte of a 70 MB with_stack trace for a backslash or a control
    # character took 0.66 s (in the target, then in the report); most traces hold none.
    from flight_profiler.agent import trace_repair

    scans: list[int] = []
    real = trace_repair._BYTE_SUSPECT

    class Counting:
        def finditer(self, text: bytes):  # type: ignore[no-untyped-def]
            scans.append(len(text))
            return real.finditer(text)

    monkeypatch.setattr(trace_repair, "_BYTE_SUSPECT", Counting())
    clean = _trace([b'    "name": "train.py(3): step",\n'] * 20)
    assert mend(clean) == (clean, 0) and scans == []
    for raw in (b'    "name": "C:\\\\x.py(3): f",\n', b'    "name": "tab\there",\n'):
        text = _trace([raw])
        out, mended = mend(text)
        assert scans and mended == (1 if b"\t" in raw else 0)
        assert json.loads(out)["traceEvents"][0]["name"] in ("C:\\x.py(3): f", "tab\there")
