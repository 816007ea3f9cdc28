"""What keeps `diagnose` on a method under 10 s (issue 18): a costly method is observed for
fewer calls, the phases whose moment does not matter run inside the census window, and the
report's inputs are loaded while the workflow waits there for the job.

Against the fake driver of test_diagnose_workflow (the agent's answers, real report engine).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from test_diagnose_workflow import FakeDriver

from flight_profiler.diagnose import preload
from flight_profiler.diagnose.model import DiagnoseOptions, MethodTarget
from flight_profiler.diagnose.workflow import run_diagnosis
from flight_profiler.report import engine, loaders


def _options(tmp_path: Path, calls: int, duration: float = 0.1) -> DiagnoseOptions:
    return DiagnoseOptions(pid=4242, out_dir=str(tmp_path / "out"),
                           target=MethodTarget.parse(["__main__", "train_step"]),
                           calls=calls, duration=duration, timeout=7.0)


def _first_call_costs(ms: float, cuda: bool = True) -> FakeDriver:
    """A fake whose locate phase sees one call of ``ms`` milliseconds (a CUDA target: the
    allocation recording runs there only)."""
    def locate(words: list[str], on_event: Any) -> dict[str, Any]:
        on_event({"type": "call", "n": 1, "cost_ms": ms, "ts": 1000.0, "thread": "MainThread"})
        return {"reason": "count", "matched": 1, "target": "__main__.train_step"}

    return FakeDriver(cuda=cuda, overrides={"watch __main__ train_step --expr cost -n 1 ": locate})


def _calls_asked(driver: FakeDriver) -> dict[str, int]:
    """-n of each command that observes calls, by its first words."""
    out: dict[str, int] = {}
    for line in driver.lines[2:]:  # after status and locate
        words = shlex.split(line)
        if "-n" in words:
            name = " ".join(words[:2]) + (" -r" if "-r" in words else "")
            out[name] = int(words[words.index("-n") + 1])
    return out


def test_a_costly_method_is_observed_for_fewer_calls(tmp_path: Path) -> None:
    # GIVEN a method whose one call takes 80 ms (a whole LBFGS step takes 250 ms or more), and
    # --calls 10
    driver = _first_call_costs(80.0)
    # WHEN it is diagnosed
    run_diagnosis(driver, _options(tmp_path, calls=10))
    # THEN the profile holds 3 of its calls (3 whole steps, per call or around), not 5; its cost
    # is watched over 5 calls, not 10; gradients are measured after 3 calls, not 5; tracing
    # stays at 3; one call is recorded (where it allocates: one whole step shows it)
    assert _calls_asked(driver) == {
        "torch profile": 3, "torch memory -r": 1, "watch __main__": 5, "trace __main__": 3,
        "torch grads": 3}


def test_a_cheap_method_keeps_the_calls_asked_for(tmp_path: Path) -> None:
    driver = _first_call_costs(10.0)
    run_diagnosis(driver, _options(tmp_path, calls=10))
    assert _calls_asked(driver) == {
        "torch profile": 5, "torch memory -r": 10, "watch __main__": 10, "trace __main__": 10,
        "torch grads": 5}
    # a CPU-only target: no recording (the profile of the same calls holds its memory events)
    driver = _first_call_costs(10.0, cuda=False)
    run_diagnosis(driver, _options(tmp_path / "cpu", calls=10))
    assert "torch memory -r" not in _calls_asked(driver)


def test_the_wait_for_growth_loads_the_report_inputs_written_so_far(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a fast loop: its phases take far less than --duration, so the workflow waits
    driver = FakeDriver()
    loads: list[tuple[str, int]] = []  # (file, commands sent by then)
    real = loaders.load_one

    def counted(path: str) -> Any:
        loads.append((os.path.basename(path), len(driver.lines)))
        return real(path)

    monkeypatch.setattr(loaders, "load_one", counted)
    monkeypatch.setattr(engine, "load_one", counted)
    # (no worker process for the trace: test_the_trace_is_loaded_by_a_niced_worker has it)
    monkeypatch.setattr(preload.Preloader, "load_aside", lambda self, path: None)
    # WHEN it is diagnosed
    result = run_diagnosis(driver, _options(tmp_path, calls=4, duration=1.0))
    # THEN the profile and the census before were loaded during the wait, before the last census
    # was asked for, and not again by the report
    last_census = next(i for i, ln in enumerate(driver.lines) if "census-after.json" in ln)
    by_file: dict[str, list[int]] = {}
    for name, sent in loads:
        by_file.setdefault(name, []).append(sent)
    for name in ("profile.json.gz", "census-before.json", "snapshot-before.pickle"):
        assert len(by_file[name]) == 1 and by_file[name][0] <= last_census, (name, loads)
    # every artefact is in the report once, and the verdict is the one of a report that loads
    # them all itself
    written = [f for p in result.phases if p.name != "report" for f in p.files]
    assert sorted(by_file) == sorted(os.path.basename(f) for f in written)
    assert all(len(v) == 1 for v in by_file.values()), loads
    assert result.report is not None
    assert result.report.findings[0].rule == "graph-retention"
    report = json.loads((Path(result.options.out_dir) / "report.json").read_text())
    assert {os.path.basename(i["path"]) for i in report["inputs"]} == set(by_file)


def _census_file(path: Path, count: int) -> None:
    path.write_text(json.dumps({"format": "flight_profiler.census", "version": 1, "pid": 1,
                                "time": 1.0, "totals": {"count": count, "bytes": 4 * count,
                                                        "with_grad_fn": 0, "graph_bytes": 0},
                                "holders": []}))


def test_a_file_replaced_since_it_was_loaded_is_loaded_again(tmp_path: Path) -> None:
    path = tmp_path / "census-before.json"
    _census_file(path, 1)
    loader = preload.Preloader()
    loader.warm([str(path)], 5.0)
    # the agent (or anyone) renames another file over it: the early load is stale
    other = tmp_path / "new.json"
    _census_file(other, 22)
    os.replace(other, path)
    assert loader.taken([str(path)]) == {}


def test_an_unchanged_file_is_handed_out_once(tmp_path: Path) -> None:
    path = tmp_path / "census-before.json"
    _census_file(path, 1)
    loader = preload.Preloader()
    loader.warm([str(path)], 5.0)
    first = loader.taken([str(path)])
    assert first[str(path)].kind == "census" and first[str(path)].ok
    assert loader.taken([str(path)]) == {}


def test_nothing_is_loaded_by_name_in_a_directory_others_may_write(tmp_path: Path) -> None:
    # root diagnosing another user's job hands them the output directory: there each artefact
    # is read once through a checked descriptor (evidence.analyze_artefacts), never by name early
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    path = shared / "census-before.json"
    _census_file(path, 1)
    loader = preload.Preloader()
    loader.warm([str(path)], 5.0)
    assert loader.taken([str(path)]) == {}


def test_a_big_trace_is_left_to_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # seconds of decoding, longer than a wait; the engine loads big ones in parallel
    monkeypatch.setattr(preload, "PRELOAD_MAX_BYTES", 100)
    path = tmp_path / "census-before.json"
    _census_file(path, 1)
    loader = preload.Preloader()
    loader.warm([str(path)], 5.0)
    assert loader.taken([str(path)]) == {}


def test_the_wait_stops_loading_at_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = []
    for n in range(3):
        paths.append(tmp_path / f"c{n}.json")
        _census_file(paths[-1], n)
    loader = preload.Preloader()
    loader.warm([str(p) for p in paths], 0.0)
    assert loader.taken([str(p) for p in paths]) == {}


def test_a_big_trace_is_loaded_while_the_last_phases_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a trace too big for the waits (an LBFGS loop's phases leave no wait at all: a
    # with_stack trace of 3 steps took 2-3 s of the report), and a CLI that may not give its
    # niced worker the normal priority back (no CAP_SYS_NICE): the worker is stopped
    import threading

    monkeypatch.setattr(preload, "PRELOAD_MAX_BYTES", 100)
    stopped: list[bool] = []
    real_stop = preload._Aside.stop

    def stop(self: Any) -> None:
        stopped.append(self.process.is_alive())
        real_stop(self)

    monkeypatch.setattr(preload._Aside, "unniced", lambda self: False)
    monkeypatch.setattr(preload._Aside, "stop", stop)
    driver = FakeDriver()
    loads: list[tuple[str, int, bool]] = []  # (file, commands sent by then, in the main thread)
    real = loaders.load_one

    def counted(path: str) -> Any:
        main = threading.current_thread() is threading.main_thread()
        loads.append((os.path.basename(path), len(driver.lines), main))
        if not main:
            time.sleep(0.5)  # longer than the fake's last phases: the report waits for it
        return real(path)

    monkeypatch.setattr(loaders, "load_one", counted)
    monkeypatch.setattr(engine, "load_one", counted)
    # WHEN it is diagnosed
    result = run_diagnosis(driver, _options(tmp_path, calls=4, duration=0.1))
    # THEN the profile's trace is loaded once, by a thread of its own once the last census is
    # taken (no phase after it measures time), and the report uses that load
    after_census = next(i for i, ln in enumerate(driver.lines) if "census-after.json" in ln) + 1
    trace = [(sent, main) for name, sent, main in loads if name == "profile.json.gz"]
    assert len(trace) == 1 and trace[0][0] >= after_census and not trace[0][1], loads
    # what is written later is left to the report, which loads every artefact once
    assert all(main for name, _, main in loads if name in ("grads.json", "snapshot-after.pickle"))
    assert sorted(name for name, _, _ in loads) == sorted(
        os.path.basename(f) for p in result.phases if p.name != "report" for f in p.files)
    assert result.report is not None and result.report.findings[0].rule == "graph-retention"
    # the report's time counts the wait for that load
    report = result.phases[-1]
    assert report.name == "report" and report.seconds >= report.data["waited_for_loads_s"] >= 0.3
    assert len(stopped) == 1  # the worker started, and was stopped at the census' end


def test_the_trace_is_loaded_by_a_niced_worker_from_the_profiles_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a loop whose phases leave no wait (duration 0.1 s)
    driver = FakeDriver()
    in_process: list[str] = []
    real = loaders.load_one
    asides: list[tuple[str, int]] = []  # (file, commands sent by then)
    real_aside = preload.Preloader.load_aside

    def counted(path: str) -> Any:
        in_process.append(os.path.basename(path))
        return real(path)

    def aside(self: preload.Preloader, path: str) -> None:
        asides.append((os.path.basename(path), len(driver.lines)))
        real_aside(self, path)

    monkeypatch.setattr(loaders, "load_one", counted)
    monkeypatch.setattr(engine, "load_one", counted)
    monkeypatch.setattr(preload.Preloader, "load_aside", aside)
    # WHEN it is diagnosed
    result = run_diagnosis(driver, _options(tmp_path, calls=4, duration=0.1))
    # THEN the trace is handed to a worker process right after the profile was asked for,
    # before any later phase, and the report uses the worker's load: this process never loads it
    profile = next(i for i, ln in enumerate(driver.lines) if ln.startswith("torch profile")) + 1
    assert asides == [("profile.json.gz", profile)]
    assert "profile.json.gz" not in in_process and in_process
    report = json.loads((Path(result.options.out_dir) / "report.json").read_text())
    (trace,) = [i for i in report["inputs"] if i["path"].endswith("profile.json.gz")]
    assert trace["ok"] and trace["kind"] == "trace", trace
    assert result.report is not None and result.report.findings[0].rule == "graph-retention"


def _nice_of(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[16])  # field 19 of stat: nice


def _big_trace(path: Path, events: int) -> None:
    rows = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 50}", "pid": 1, "tid": 1,
             "ts": i * 2.0, "dur": 1.0} for i in range(events)]
    path.write_text(json.dumps({"traceEvents": rows}))


def test_the_worker_loads_at_the_lowest_priority_until_nothing_is_measured(tmp_path: Path) -> None:
    # GIVEN a trace that takes the worker a while to load
    path = tmp_path / "profile.json"
    _big_trace(path, 300_000)
    loader = preload.Preloader()
    # WHEN it is loaded aside
    loader.load_aside(str(path))
    (aside,) = loader._aside.values()
    own = os.getpriority(os.PRIO_PROCESS, 0)
    seen: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and aside.process.is_alive():
        nice = _nice_of(aside.process.pid)
        if nice is not None:
            seen.add(nice)
        if nice == own + preload.ASIDE_NICE:
            break
        time.sleep(0.005)
    # THEN it runs niced to 19 while phases may measure, with the normal priority once none does
    assert own + preload.ASIDE_NICE in seen, seen
    loader.load_behind([str(path)])
    if aside.process.is_alive():  # given back its priority (root, or CAP_SYS_NICE), or stopped
        assert _nice_of(aside.process.pid) in (own, None)
    # AND its load is the one handed out, as a load in this process would read the file
    got = loader.taken([str(path)])[str(path)]
    mine = loaders.load_one(str(path))
    assert got.ok and got.kind == mine.kind == "trace"
    assert got.data["events"] == mine.data["events"] == 300_000
    assert not aside.process.is_alive()


def test_a_worker_that_dies_leaves_the_trace_to_the_report(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    _big_trace(path, 200_000)
    loader = preload.Preloader()
    loader.load_aside(str(path))
    (aside,) = loader._aside.values()
    aside.process.kill()  # the OOM killer, say
    assert loader.taken([str(path)]) == {}


def test_a_diagnosis_that_ends_early_leaves_no_loading_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a target that vanishes after the profile (the loading worker has started)
    from flight_profiler.diagnose import workflow
    from flight_profiler.errors import FlightProfilerError

    started: list[Any] = []
    real_init = preload._Aside.__init__

    def init(self: Any, path: str, sig: Any) -> None:
        real_init(self, path, sig)
        started.append(self)

    def vanished(run: Any, phase: Any) -> None:
        raise workflow.TargetUnusable(FlightProfilerError("the target exited"))

    monkeypatch.setattr(preload._Aside, "__init__", init)
    phases = [(n, t, vanished if n == "watch" else fn) for n, t, fn in workflow.PHASES]
    monkeypatch.setattr(workflow, "PHASES", phases)
    # WHEN it is diagnosed
    with pytest.raises(FlightProfilerError, match="exited"):
        run_diagnosis(FakeDriver(), _options(tmp_path, calls=4, duration=0.1))
    # THEN the worker was stopped with it
    assert len(started) == 1 and not started[0].process.is_alive()
