"""Text that is not quite UTF-8 JSON (issue 19): invalid UTF-8 in a name is read as U+FFFD
(before: "unreadable (UnicodeDecodeError ...); please report this file"), and a UTF-8 BOM at
the start is skipped (before: "not a Chrome trace ...")."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from cli_child import report

from flight_profiler.errors import ExitCode

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BOM = b"\xef\xbb\xbf"


def _trace(bare: bool = False) -> bytes:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0 * i,
               "dur": 5.0} for i in range(30)]
    return json.dumps(events if bare else {"traceEvents": events, "traceName": "t"}).encode()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name, bare", [("t.json", False), ("t.json.gz", False), ("bare.json", True)])
def test_invalid_utf8_in_a_name_is_read_with_a_replacement_character(tmp_path: Path, name: str,
                                                                     bare: bool) -> None:
    # GIVEN a trace whose operator name holds bytes that are not UTF-8 (bare: the stdlib reader)
    data = _trace(bare).replace(b"aten::mm", b"aten::\xff\xfemm", 1)
    path = _write(tmp_path / name, data)
    # WHEN report reads it
    proc, _, _ = report(tmp_path, str(path), "--json")
    # THEN it is read: the name carries U+FFFD, the other events are as they were
    assert proc.returncode == ExitCode.OK, proc.stderr
    ops = json.loads(proc.stdout)["inputs"][0]["metrics"]["top_operators"]
    assert {op["name"]: op["calls"] for op in ops} == {"aten::\ufffd\ufffdmm": 1, "aten::mm": 29}


@pytest.mark.parametrize("name, bare", [("t.json", False), ("t.json.gz", False), ("bare.json", True)])
def test_a_trace_starting_with_a_bom_is_read(tmp_path: Path, name: str, bare: bool) -> None:
    path = _write(tmp_path / name, BOM + _trace(bare))
    proc, _, _ = report(tmp_path, str(path), "--json")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert json.loads(proc.stdout)["inputs"][0]["metrics"]["events"] == 30


@pytest.mark.parametrize("source, kind, key", [
    ("agent/census_0.json", "census", b'"label": "'), ("agent/grads.json", "grads", b'"label":"'),
    ("ranks/stuck/stacks/stacks_rank0.json", "stacks", b'"function": "')])
def test_our_own_files_with_a_bom_or_bad_bytes_are_read(tmp_path: Path, source: str, kind: str,
                                                        key: bytes) -> None:
    real = (FIXTURES / source).read_bytes()
    assert key in real
    # GIVEN the file with a BOM, and the file with a byte that is not UTF-8 in a string
    for i, data in enumerate([BOM + real, real.replace(key, key + b"\xff", 1)]):
        path = _write(tmp_path / f"{i}-{Path(source).name}", data)
        # THEN each is read as what it is
        proc, _, _ = report(tmp_path, str(path), "--json")
        assert proc.returncode == ExitCode.OK, proc.stderr
        assert json.loads(proc.stdout)["inputs"][0]["kind"] == kind
