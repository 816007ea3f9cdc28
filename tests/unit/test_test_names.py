"""Test modules are imported by basename (rootdir, no packages): two files with one name in
tests/unit and tests/integration stop the whole run at collection ("import file mismatch")."""

from __future__ import annotations

from collections import Counter

from support import REPO


def test_every_test_module_has_its_own_basename() -> None:
    names = Counter(p.name for p in (REPO / "tests").rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
