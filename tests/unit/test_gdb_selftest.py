"""The gdb self-test's verdicts and their cache (fake gdbs: the logic, not a real debugger)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flight_profiler.attach import gdb_selftest
from flight_profiler.errors import AttachFailed

# Prints what a successful `call getpid()` prints, without touching the child.
ANSWERS = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = "-p" ] && pid=$2; shift; done
echo "\\$1 = $pid"
"""
BROKEN = """#!/bin/sh
echo "Couldn't write extended state status: Bad address." >&2
"""


def _fake(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_a_gdb_whose_call_works_and_child_lives_passes(tmp_path) -> None:
    ok, why = gdb_selftest.run_selftest(_fake(tmp_path, "gdb-ok", ANSWERS))
    assert ok, why


def test_a_gdb_that_cannot_call_fails_with_its_own_words(tmp_path) -> None:
    ok, why = gdb_selftest.run_selftest(_fake(tmp_path, "gdb-broken", BROKEN))
    assert not ok
    assert "Couldn't write extended state" in why


def test_verdict_is_cached_per_binary(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = _fake(tmp_path, "gdb-ok", ANSWERS)
    bad = _fake(tmp_path, "gdb-broken", BROKEN)
    gdb_selftest.check(good)
    with pytest.raises(AttachFailed, match="cannot safely call") as err:
        gdb_selftest.check(bad)
    assert "FLIGHT_PROFILER_GDB" in err.value.hint

    def must_not_run(*_a: object) -> tuple[bool, str]:
        raise AssertionError("self-test ran again despite a cached verdict")

    monkeypatch.setattr(gdb_selftest, "run_selftest", must_not_run)
    gdb_selftest.check(good)
    with pytest.raises(AttachFailed):
        gdb_selftest.check(bad)
