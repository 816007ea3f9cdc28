"""Unsafe, corrupt, truncated, empty and foreign inputs: one clear line each, others still read."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

from click.testing import CliRunner
from report_synth import snapshot, write_pickle

from flight_profiler.cli.report_cmd import report as report_cmd
from flight_profiler.errors import ExitCode
from flight_profiler.report import analyze
from support import TRACES


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [_Evil(str(marker))]}, protocol=2))
    report = analyze([str(evil)])
    (inp,) = report.inputs
    assert not inp.ok
    assert "unsafe pickle" in inp.error and "system" in inp.error
    assert not marker.exists()


def test_malicious_pickle_protocol_0_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned0"
    evil = tmp_path / "evil0.pickle"
    evil.write_bytes(pickle.dumps(_Evil(str(marker)), protocol=0))
    (inp,) = analyze([str(evil)]).inputs
    assert not inp.ok and "unsafe" in inp.error
    assert not marker.exists()


def test_truncated_pickle(tmp_path: Path) -> None:
    data = pickle.dumps(snapshot(allocated=[(1 << 20, "train.py", 3)]), protocol=4)
    p = tmp_path / "cut.pickle"
    p.write_bytes(data[: len(data) // 2])
    (inp,) = analyze([str(p)]).inputs
    assert not inp.ok and "pickle" in inp.error


def test_pickle_that_is_not_a_snapshot(tmp_path: Path) -> None:
    p = write_pickle(tmp_path / "other.pickle", {"weights": [1, 2, 3]})
    (inp,) = analyze([str(p)]).inputs
    assert not inp.ok and "not a memory snapshot" in inp.error


def test_empty_foreign_truncated_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    png = tmp_path / "image.json"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    cut = tmp_path / "cut.json.gz"
    raw = (TRACES / "gpu_event_sync.json.gz").read_bytes()
    cut.write_bytes(raw[: len(raw) // 2])
    no_events = tmp_path / "no_events.json"
    no_events.write_text('{"schemaVersion": 1, "traceEvents": []}')
    cut_plain = tmp_path / "cut_plain.json"
    cut_plain.write_bytes(gzip.decompress(raw)[:5000])
    report = analyze([str(empty), str(png), str(cut), str(cut_plain), str(no_events),
                      str(tmp_path / "nope.json"),
                      str(TRACES / "gpu_event_sync.json.gz")])
    errors = {Path(i.path).name: i.error for i in report.inputs if not i.ok}
    assert "empty" in errors["empty.json"]
    assert "not a Chrome trace" in errors["image.json"]
    assert "gzip" in errors["cut.json.gz"] or "truncated" in errors["cut.json.gz"]
    assert "truncated" in errors["cut_plain.json"]
    assert errors["nope.json"] == "no such file"
    assert "no events" in errors["no_events.json"]
    assert len(report.readable) == 1  # the good trace is still reported


def test_cli_exit_codes_for_bad_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    runner = CliRunner()
    only_bad = runner.invoke(report_cmd, [str(bad), "--format", "json"], standalone_mode=False)
    assert only_bad.exception is not None
    assert getattr(only_bad.exception, "exit_code", None) == ExitCode.BAD_INPUT_FILE
    mixed = runner.invoke(report_cmd, [str(bad), str(TRACES / "gpu_event_sync.json.gz"), "--json"])
    assert mixed.exit_code == 0
    assert f"{bad}:" in mixed.stderr


def _pools(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Worker pools the engine starts (each runs its loads here, in this process)."""
    import concurrent.futures

    started: list[int] = []

    class Pool:
        def __init__(self, max_workers: int, mp_context: object) -> None:
            started.append(max_workers)

        def __enter__(self) -> Pool:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def map(self, fn, items):  # type: ignore[no-untyped-def]
            return map(fn, items)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    return started


def test_one_big_trace_among_small_files_is_loaded_without_workers(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # diagnose's artefacts: one with_stack trace of 60 MB decoded and small censuses and
    # pickles. Two spawned workers took 5.2 s for it, one process 2.2 s: the big one is the
    # whole wait either way.
    from flight_profiler.report import engine

    started = _pools(monkeypatch)
    big, other = (str(TRACES / f"gpu_train_{x}.json.gz") for x in ("control", "test"))
    small = tmp_path / "snap.pickle"
    write_pickle(small, snapshot())
    # "big": what each of the traces counts for (gzip: 10x its size)
    monkeypatch.setattr(engine, "PARALLEL_MIN_BYTES", min(map(os.path.getsize, (big, other))) * 10)
    report = engine.analyze([big, str(small)], jobs=2)
    assert all(i.ok for i in report.inputs) and started == []
    # two inputs that big: in parallel, as before
    report = engine.analyze([big, other], jobs=2)
    assert all(i.ok for i in report.inputs) and started == [2]
