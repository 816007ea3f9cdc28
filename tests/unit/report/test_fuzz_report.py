"""Seeded, bounded fuzzing of every file kind `report` reads, in CI (issue 19): each mutated
file (fuzz_cases.py) ends in a report or in one clean error line, with a documented exit code,
no traceback, within CPU, wall-time and peak-RSS bounds (fuzz_report.py runs the cases and
judges them). The same harness runs thousands of cases by hand:
``python tests/unit/report/fuzz_report.py --cases 3000 --seed N``."""

from __future__ import annotations

from typing import Any

import pytest
from fuzz_cases import KINDS
from fuzz_report import run, summary

SEED = 19
PER_KIND = 3  # 27 cases, one child process: a few seconds


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run(SEED, list(range(PER_KIND * len(KINDS))))


@pytest.mark.parametrize("kind", KINDS)
def test_every_fuzzed_file_ends_in_a_report_or_one_clean_line(results: list[dict[str, Any]],
                                                             kind: str) -> None:
    mine = [r for r in results if r["kind"] == kind]
    assert len(mine) == PER_KIND
    failed = [f"{r['case']}: {r['failure']}" for r in mine if r["failure"]]
    assert not failed, failed
    assert summary(mine) == {kind: (PER_KIND, PER_KIND)}
