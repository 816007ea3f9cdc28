"""The CLI side's one atomic writer: a failed write leaves the old file and no temp file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from flight_profiler import atomic_files
from flight_profiler.atomic_files import write_text_atomic


def _listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("failing", ["fsync", "rename"])
def test_a_write_that_fails_midway_leaves_no_temp_file_and_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    # GIVEN a report written once
    target = tmp_path / "report.md"
    write_text_atomic(str(target), "# old report\n")
    # WHEN the next write fails after its bytes went out (disk full at fsync, a rename refused)
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_files.os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(str(target), "# new report " + "x" * 100_000)
    monkeypatch.undo()
    # THEN the old report is whole and nothing else is left in the directory
    assert target.read_text() == "# old report\n"
    assert _listing(tmp_path) == ["report.md"]


def test_an_empty_text_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("{}\n")
    with pytest.raises(OSError, match="empty"):
        write_text_atomic(str(target), "")
    assert target.read_text() == "{}\n" and _listing(tmp_path) == ["report.json"]


def test_a_written_file_has_the_mode_plain_open_would_give(tmp_path: Path) -> None:
    # Reports were written with open(path, "w"): users keep the permissions they had.
    plain = tmp_path / "plain.md"
    plain.write_text("x")
    atomic = tmp_path / "atomic.md"
    assert write_text_atomic(str(atomic), "é\n") == len("é\n".encode())
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    assert atomic.read_text(encoding="utf-8") == "é\n"


def test_a_report_whose_view_fails_leaves_the_old_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from flight_profiler.render import formats
    from flight_profiler.report.models import Report

    target = tmp_path / "report.html"
    target.write_text("<p>old</p>")

    def broken(report: Report) -> str:
        raise RuntimeError("a view bug")

    monkeypatch.setattr(formats, "render_html", broken)
    with pytest.raises(RuntimeError):
        formats.write_report(Report(inputs=[], findings=[]), str(target))
    assert target.read_text() == "<p>old</p>" and _listing(tmp_path) == ["report.html"]
    monkeypatch.undo()
    assert formats.write_report(Report(inputs=[], findings=[]), str(target)) == "html"
    assert "<html" in target.read_text().lower()
