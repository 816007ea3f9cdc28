"""`report DIR` walks the directory once, however its links loop, within caps (issue 19: two
symlinks to the directory itself made the recursive glob walk 2^depth paths: it hung)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_child import report

from flight_profiler.errors import ExitCode
from flight_profiler.report import walk
from flight_profiler.report.walk import walk_inputs
from support import TRACES

TRACE = TRACES / "cpu_only_tiny.json.gz"


def _logdir(tmp_path: Path) -> Path:
    run = tmp_path / "logs" / "plugins" / "profile" / "run1"
    run.mkdir(parents=True)
    shutil.copy(TRACE, run / "host_1.pt.trace.json.gz")
    return tmp_path / "logs"


def test_links_to_the_directory_itself_are_walked_once(tmp_path: Path) -> None:
    # GIVEN a log directory holding two links to itself and one to its parent
    logs = _logdir(tmp_path)
    for name, target in (("a", "."), ("b", "."), ("up", "..")):
        os.symlink(target, logs / name)
    # WHEN report reads it
    proc, _, _ = report(tmp_path, str(logs), "--json", timeout=60)
    # THEN it ends (before: it never did), with the one trace in it, read once
    assert proc.returncode == ExitCode.OK, proc.stderr
    inputs = json.loads(proc.stdout)["inputs"]
    assert [Path(i["path"]).name for i in inputs] == ["host_1.pt.trace.json.gz"]
    assert proc.stderr == ""


def test_a_link_to_a_run_directory_is_followed(tmp_path: Path) -> None:
    # GIVEN a directory whose only run is a link to a directory elsewhere (gathered from nodes)
    elsewhere = _logdir(tmp_path / "node1")
    top = tmp_path / "job"
    top.mkdir()
    os.symlink(elsewhere, top / "node1")
    found, stopped = walk_inputs(str(top))
    assert [Path(f).name for f in found] == ["host_1.pt.trace.json.gz"] and stopped is None


def test_hidden_entries_and_other_files_are_left_out(tmp_path: Path) -> None:
    logs = _logdir(tmp_path)
    (logs / ".hidden").mkdir()
    (logs / ".hidden" / "x.json").write_text("{}")
    (logs / ".y.json").write_text("{}")
    (logs / "notes.txt").write_text("")
    (logs / "snap.pickle").write_bytes(b"")
    found, _ = walk_inputs(str(logs))
    assert sorted(Path(f).name for f in found) == ["host_1.pt.trace.json.gz", "snap.pickle"]


def test_deep_directories_stop_the_walk_with_a_note(tmp_path: Path) -> None:
    # GIVEN a trace at the top and a file nested deeper than the walk goes
    logs = _logdir(tmp_path)
    deep = logs.joinpath(*["d"] * (walk.MAX_DEPTH + 2))
    deep.mkdir(parents=True)
    (deep / "far.json").write_text("{}")
    # WHEN report reads the directory
    proc, _, _ = report(tmp_path, str(logs), "--json", timeout=60)
    # THEN the trace is read and one warning line says where the walk stopped
    assert proc.returncode == ExitCode.OK, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("warning: ") and f"nested more than {walk.MAX_DEPTH} deep" in line


@pytest.mark.parametrize("cap, entries, why", [("MAX_ENTRIES", 50, "more than 50 entries"),
                                               ("MAX_INPUTS", 30, "more than 30 input files")])
def test_a_crowded_directory_stops_the_walk_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         cap: str, entries: int, why: str) -> None:
    monkeypatch.setattr(walk, cap, entries)
    for i in range(200):
        (tmp_path / f"e{i:03d}.json").write_text("{}")
    found, stopped = walk_inputs(str(tmp_path))
    assert len(found) <= entries and stopped is not None and stopped.startswith(why), stopped


def test_a_diagnose_directory_is_read_without_its_own_outputs(tmp_path: Path) -> None:
    # GIVEN a diagnose output directory: its artefacts, its diagnose.json and a report.json
    run = tmp_path / "run"
    run.mkdir()
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "agent"
    shutil.copy(fixtures / "census_0.json", run / "census-before.json")
    shutil.copy(TRACE, run / "profile.json.gz")
    (run / "diagnose.json").write_text(json.dumps({"format": "flight_profiler.diagnose", "version": 1}))
    proc, _, _ = report(tmp_path, str(run / "profile.json.gz"), "--json")
    (run / "report.json").write_text(proc.stdout)
    # WHEN report reads the directory
    proc, _, _ = report(tmp_path, str(run), "--json")
    # THEN the artefacts are read and the two summaries skipped without a word (before: each
    # was a "bad Chrome trace: no traceEvents array" warning)
    assert proc.returncode == ExitCode.OK and proc.stderr == "", proc.stderr
    assert sorted(Path(i["path"]).name for i in json.loads(proc.stdout)["inputs"]) == [
        "census-before.json", "profile.json.gz"]
    # and named on the command line, one is refused in one line
    proc, _, _ = report(tmp_path, str(run / "diagnose.json"))
    assert proc.returncode == ExitCode.BAD_INPUT_FILE and "not an input" in proc.stderr
