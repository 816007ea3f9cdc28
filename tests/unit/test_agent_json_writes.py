"""The agent writes big JSON (traces, censuses) in ~1 MB blocks: every write releases the GIL,
and a busy target thread then holds it for a whole switch interval."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flight_profiler.agent import torch_support


def _trace(n: int) -> dict[str, Any]:
    return {"traceEvents": [{"ph": "X", "name": f"aten::op{i % 50}", "ts": i * 1.5, "dur": 1.0,
                             "pid": 1, "tid": 2, "args": {"stack": ["a.py(1): f", "b.py(2): g"]}}
                            for i in range(n)]}


class _CountingFile:
    def __init__(self) -> None:
        self.writes = 0
        self.data = bytearray()

    def write(self, b: bytes) -> int:
        self.writes += 1
        self.data += b
        return len(b)


def test_a_big_document_is_written_in_few_blocks_and_reads_back_the_same() -> None:
    trace = _trace(20_000)
    f = _CountingFile()
    torch_support._dump_json(trace, f)  # type: ignore[arg-type]
    assert len(f.data) > 2 << 20
    assert f.writes <= len(f.data) // (1 << 20) + 1  # one per MB (was one per JSON token)
    assert json.loads(f.data) == trace


@pytest.mark.parametrize("doc", [
    {"traceEvents": [{"ph": "X", "name": f"op{i}", "args": {"v": [i, None, 1.5]}} for i in range(2501)],
     "traceName": "t\u2028", "empty": [], "nested": {"list": list(range(1001))}},
    [{"k": i} for i in range(3001)],
    {1: "int key", "b": float("nan")},
    {"a": [{1, 2}] * 1001},  # default=str, inside a sliced list too
    "a string",
])
def test_documents_are_written_as_json_dumps_writes_them(doc: Any) -> None:
    f = _CountingFile()
    torch_support._dump_json(doc, f)  # type: ignore[arg-type]
    assert bytes(f.data) == json.dumps(doc, separators=(",", ":"), default=str).encode()
