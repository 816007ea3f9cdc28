"""The diagnose workflow against a fake driver: phases, skips, timeouts, outputs, progress.

The fake answers command lines the way the agent does (shapes taken from the agent's handlers)
and writes the files a command was asked for, so the real report engine runs on the result.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from flight_profiler.diagnose.driver import PhaseTimeout
from flight_profiler.diagnose.model import DiagnoseOptions, MethodTarget
from flight_profiler.diagnose.workflow import run_diagnosis
from flight_profiler.errors import FlightProfilerError, RemoteCommandError, TorchMissing
from flight_profiler.requests import AgentRequest, parse
from support import TRACES

Handler = Callable[[list[str], Any], dict[str, Any]]


def census(path: str, losses: int) -> None:
    """A census whose list `__main__.losses` holds `losses` tensors with grad_fn."""
    holder = {"path": "__main__.losses[*]", "example": "__main__.losses[0]", "kind": "list",
              "count": losses, "bytes": 4 * losses, "with_grad_fn": losses,
              "graph_bytes": 65536 * losses}
    Path(path).write_text(json.dumps({
        "format": "flight_profiler.census", "version": 1, "pid": 4242, "time": 1000.0 + losses,
        "totals": {"count": losses, "bytes": 4 * losses, "with_grad_fn": losses,
                   "graph_bytes": 65536 * losses},
        "holders": [holder],
    }))


class FakeDriver:
    """Answers requests by their command lines; `overrides` maps a command prefix to a handler."""

    def __init__(self, cuda: bool = False, torch_imported: bool = True,
                 overrides: dict[str, Handler] | None = None) -> None:
        self.cuda = cuda
        self.torch_imported = torch_imported
        self.lines: list[str] = []
        self.requests: list[AgentRequest] = []
        self.timeouts: list[float | None] = []
        self.censuses = 0
        self.overrides = overrides or {}
        self.zero_grad = True  # the fake model's optimizer calls zero_grad() every step

    def run(self, request: AgentRequest, on_event: Any = None, timeout: float | None = None) -> dict[str, Any]:
        # what a user re-running the phase by hand types gives back the same request
        assert parse(request.line) == request
        line = request.line
        self.lines.append(line)
        self.requests.append(request)
        self.timeouts.append(timeout)
        words = shlex.split(line)
        for prefix, handler in self.overrides.items():
            if line.startswith(prefix):
                return handler(words, on_event)
        if words[0] == "status":
            return {"torch": {"imported": self.torch_imported, "version": "2.13.0",
                              "cuda_available": self.cuda}, "python": {"version": "3.11.7"}}
        if words[0] == "torch" and not self.torch_imported:
            raise TorchMissing("the target has not imported torch")
        path = words[words.index("-f") + 1] if "-f" in words else None
        count = int(words[words.index("-n") + 1]) if "-n" in words else 1
        if words[:2] == ["torch", "memory"]:
            if path:
                Path(path).write_bytes(b"\x80\x04N.")
            return {"mode": "summary", "cuda": self.cuda}
        if words[:2] == ["torch", "tensors"]:
            self.censuses += 1
            census(path or "", 100 * self.censuses)
            return {"totals": {"count": 100 * self.censuses}}
        if words[:2] == ["torch", "profile"]:
            shutil.copy(TRACES / "cpu_only_tiny.json.gz", path or "")
            for n in range(1, 4):
                on_event({"event": "progress", "calls_done": n, "calls": 3})
            return {"path": path, "calls_recorded": 3}
        if words[0] == "watch":
            on_event({"type": "watching"})
            for n in range(count):
                # A busy loop: each call ends ~its own cost after the previous one.
                on_event({"type": "call", "n": n + 1, "cost_ms": 10.0 + n, "ts": 1000.0 + 0.0125 * n,
                          "thread": "MainThread"})
            return {"reason": "count", "matched": count, "target": "__main__.train_step"}
        if words[:2] == ["torch", "dataloader"]:
            return {"loaders": [], "threads": [], "sampled_s": 0.5, "cpus": 2}
        if words[0] == "stack":
            return {"threads": [{"name": "MainThread", "frames": [
                {"file": "/work/train.py", "function": "<module>", "line": 40},
                {"file": "/work/train.py", "function": "main", "line": 12}]}]}
        if words[:2] == ["torch", "grads"]:
            doc = grads_doc(count, self.zero_grad)
            Path(path or "").write_text(json.dumps(doc))
            return doc
        if words[0] == "trace":
            for n in range(count):
                on_event({"type": "trace", "n": n + 1, "tree": {
                    "name": "train_step", "ms": 10.0, "count": 1, "children": [
                        {"name": "forward", "ms": 6.0, "count": 1},
                        {"name": "backward", "ms": 3.0, "count": 1}]}})
            return {"reason": "count"}
        raise AssertionError(f"unexpected command {line!r}")


def grads_doc(count: int, zeroed: bool = True) -> dict[str, Any]:
    """A model and its optimizer as `torch grads` writes them (zeroed: zero_grad() each step)."""
    return {"format": "flight_profiler.grads", "version": 1, "pid": 4242, "time": 0.0, "mode": "method",
            "target": "__main__.train_step",
            "models": [{"name": "__main__.model", "class": "torch.nn.modules.linear.Linear", "params": 1,
                        "numel": 10, "layers": [{"name": "weight"}]}],
            "measurements": [{"models": [{"grad_norm": float(n + 1) if not zeroed else 1.0,
                                          "layers": [[float(n + 1), 1.0, 0, 0, 1.0]],
                                          "weight_norms": [1.0], "nonfinite_grad_layers": 0}]}
                             for n in range(count)],
            "optimizers": [{"class": "torch.optim.sgd.SGD", "params": 1, "model": 0, "lr": 0.1,
                            "steps": count, "zero_grad_calls": count if zeroed else 0}],
            "zeroing": {"observed": True, "module_zero_grad_calls": [0]}}


@pytest.fixture
def options(tmp_path: Path) -> DiagnoseOptions:
    return DiagnoseOptions(pid=4242, out_dir=str(tmp_path / "out"),
                           target=MethodTarget.parse(["__main__", "train_step"]),
                           calls=4, duration=0.1, timeout=7.0)


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def phase(self, index: int, total: int, title: str) -> None:
        self.lines.append(f"phase {index}/{total} {title}")

    def waiting(self, text: str) -> None:
        self.lines.append(f"waiting {text}")

    def done(self, result: Any) -> None:
        self.lines.append(f"done {result.name} {result.status}")

    def close(self) -> None:
        pass


def statuses(result: Any) -> dict[str, str]:
    return {p.name: p.status for p in result.phases}


def test_cpu_run_runs_every_phase_and_writes_everything(options: DiagnoseOptions) -> None:
    # A CPU-only target gets the agent's CPU snapshots too; not the CPU allocation recording,
    # whose memory events the profile of the same calls already holds (and no rule reads).
    driver = FakeDriver(cuda=False)
    result = run_diagnosis(driver, options)
    st = statuses(result)
    for name in ("status", "locate", "memory", "snapshot-before", "census-before", "profile",
                 "watch", "census-middle", "input", "trace", "grads", "census-after",
                 "snapshot-after", "report"):
        assert st[name] == "ok", (name, result.phase(name).reason)
    assert st["record"] == "skipped" and "profile" in (result.phase("record").reason or "")
    assert any(" -s " in ln for ln in driver.lines) and not any(" -r " in ln for ln in driver.lines)
    out = Path(options.out_dir)
    assert not (out / "record.pickle").exists()
    for name in ("snapshot-before.pickle", "snapshot-after.pickle",
                 "census-before.json", "census-middle.json", "census-after.json", "profile.json.gz", "report.md",
                 "report.json", "report.html", "diagnose.json"):
        assert (out / name).stat().st_size > 0, name
    # the census pair reached the report engine: the growing list is found
    assert result.report is not None
    assert result.report.findings[0].rule == "graph-retention"
    report = json.loads((out / "report.json").read_text())
    assert report["diagnose"]["cost"]["calls"] == 4
    assert "Diagnose workflow" in (out / "report.md").read_text()
    assert 'id="diagnose"' in (out / "report.html").read_text()
    diag = json.loads((out / "diagnose.json").read_text())
    assert [p["name"] for p in diag["phases"]][-1] == "report"
    assert diag["findings"][0]["rule"] == "graph-retention"


def test_commands_are_typed_as_a_user_would(options: DiagnoseOptions) -> None:
    driver = FakeDriver(cuda=True)
    run_diagnosis(driver, options)
    out = options.out_dir
    expected = [
        "status",
        "watch __main__ train_step --expr cost -n 1 --timeout 5",
        f"torch tensors __main__ train_step -f {out}/census-before.json --timeout 7",
        # inside the census window, where a fast loop's diagnosis waits anyway
        "torch memory",
        f"torch memory -s -f {out}/snapshot-before.pickle",
        f"torch profile __main__ train_step --window --duration 0.1 -n 4 --budget 1 -f {out}/profile.json.gz "
        "--profile-memory --with-stack --row-limit 0 --timeout 7",
        f"torch memory -r __main__ train_step -n 4 -f {out}/record.pickle --timeout 7 --budget 0.75",
        "watch __main__ train_step --expr cost -n 4 --timeout 7",
        # three censuses, each right after a call of the method, each compared with the last
        f"torch tensors __main__ train_step -f {out}/census-middle.json --diff {out}/census-before.json "
        "--timeout 7",
        "torch dataloader __main__ train_step --sample 2 --sample-if-none 1",
        "trace __main__ train_step -n 4 -i 0.01 -d 8 --timeout 7",
        f"torch tensors __main__ train_step -f {out}/census-after.json --diff {out}/census-middle.json "
        "--timeout 7",
        f"torch memory -s -f {out}/snapshot-after.pickle",
        f"torch grads __main__ train_step -n 4 -f {out}/grads.json --timeout 7",
    ]
    assert driver.lines == expected
    # every command has a backstop deadline beyond the limit it was given itself
    assert all(t is not None and t > options.timeout for t in driver.timeouts)
    # the profile's also covers torch's export inside the target (EXPORT_S): a loaded box's
    # with_stack window exported past the old backstop and the phase lost its trace
    from flight_profiler.diagnose.workflow import EXPORT_S

    profile_timeout = driver.timeouts[driver.lines.index(expected[5])]
    assert profile_timeout is not None and profile_timeout >= options.timeout + EXPORT_S


def test_each_phase_records_the_line_that_re_runs_it(options: DiagnoseOptions) -> None:
    # GIVEN a diagnosis whose training phase also runs `torch anomaly` (NaN gradients)
    def nan_grads(words: list[str], on_event: Any) -> dict[str, Any]:
        doc = grads_doc(4)
        doc["measurements"][-1]["models"][0]["nonfinite_grad_layers"] = 1
        Path(words[words.index("-f") + 1]).write_text(json.dumps(doc))
        return doc

    driver = FakeDriver(overrides={"torch grads": nan_grads,
                                   "torch anomaly": lambda words, on_event: {"first": None}})
    result = run_diagnosis(driver, options)
    # WHEN a user copies a phase's command from the report
    recorded = [line for p in result.phases if p.command for line in p.command.split("; ")]
    # THEN parsing it gives back exactly the request the phase sent
    assert [parse(line) for line in recorded] == driver.requests[-len(recorded):]
    assert recorded[-1] == "torch anomaly __main__ train_step -n 1 --timeout 7"


def test_watch_and_trace_numbers(options: DiagnoseOptions) -> None:
    result = run_diagnosis(FakeDriver(), options)
    cost = result.phase("watch").data["cost"]
    assert cost["calls"] == 4 and cost["min_ms"] == 10.0 and cost["max_ms"] == 13.0
    assert cost["median_ms"] == 11.5
    where = result.phase("trace").data["where_time_goes"]
    assert where["calls"] == 4 and where["total_ms"] == 40.0
    assert [r["name"] for r in where["top"]] == ["forward", "backward"]
    assert where["top"][0]["share_pct"] == 60.0
    assert where["self_pct"] == 10.0


def test_a_quick_method_in_a_slow_loop_is_watched_traced_and_measured_over_fewer_calls(
        options: DiagnoseOptions) -> None:
    # GIVEN a forward of 5 ms called once a step of 220 ms (a language model whose carried
    # hidden state makes every backward longer)
    def watch(words: list[str], on_event: Any) -> dict[str, Any]:
        count = int(words[words.index("-n") + 1])
        on_event({"type": "watching"})
        for n in range(count):
            on_event({"type": "call", "n": n + 1, "cost_ms": 5.0, "ts": 1000.0 + 0.22 * n,
                      "thread": "MainThread"})
        return {"reason": "count", "matched": count, "target": "__main__.train_step"}

    driver = FakeDriver(overrides={"watch": watch})
    result = run_diagnosis(driver, options)
    counts = {line.split()[0] if not line.startswith("torch") else " ".join(line.split()[:2]):
              int(line.split()[line.split().index("-n") + 1])
              for line in driver.lines[1:] if "-n" in line.split()}
    # THEN the watch takes all 4 (its first call's 5 ms said nothing of the period), and
    # the gradients, knowing the 220 ms period, 3 (the least: a trend), and the trace the 2
    # that fit in 0.6 s (a call tree is the same from one call to the next)
    assert result.phase("watch").data["loop"]["period_ms"] == pytest.approx(220.0)
    assert counts["watch"] == 4
    assert counts["trace"] == 2 and counts["torch grads"] == 3
    # AND the profile's calls are not cut: its whole steps are the report's per-step figures
    assert counts["torch profile"] == 4


def test_method_never_called_skips_its_phases_and_profiles_a_window(options: DiagnoseOptions) -> None:
    def never(words: list[str], on_event: Any) -> dict[str, Any]:
        on_event({"type": "watching"})
        return {"reason": "timeout", "matched": 0, "calls": 0}

    driver = FakeDriver(overrides={"watch": never})
    result = run_diagnosis(driver, options)
    st = statuses(result)
    assert st["locate"] == st["watch"] == st["trace"] == st["record"] == "skipped"
    assert "train_step was not called within 7s" in result.phase("watch").reason
    assert st["profile"] == "ok" and "--duration 0.1" in result.phase("profile").command
    assert st["census-after"] == "ok" and st["report"] == "ok"
    assert not any(ln.startswith("trace") for ln in driver.lines)


def test_torch_not_imported_still_watches_and_traces(options: DiagnoseOptions) -> None:
    result = run_diagnosis(FakeDriver(torch_imported=False), options)
    st = statuses(result)
    for name in ("memory", "census-before", "profile", "census-after"):
        assert st[name] == "skipped", name
        assert "not imported torch" in result.phase(name).reason
    assert st["watch"] == st["trace"] == "ok"
    assert st["report"] == "skipped"  # nothing to analyse
    assert (Path(options.out_dir) / "diagnose.json").exists()


def test_a_typo_in_the_method_stops_the_diagnosis_with_the_agent_error(options: DiagnoseOptions) -> None:
    def missing(words: list[str], on_event: Any) -> dict[str, Any]:
        raise RemoteCommandError("module '__main__' has no attribute 'train_stp'",
                                 "names in __main__ that look close: train_step")

    driver = FakeDriver(overrides={"watch": missing})
    with pytest.raises(RemoteCommandError, match="train_stp"):
        run_diagnosis(driver, options)
    assert driver.lines == ["status", "watch __main__ train_step --expr cost -n 1 --timeout 5"]


def test_a_phase_that_times_out_does_not_stop_the_others(options: DiagnoseOptions) -> None:
    def stuck(words: list[str], on_event: Any) -> dict[str, Any]:
        on_event({"type": "trace", "n": 1, "tree": {"name": "train_step", "ms": 5.0}})
        raise PhaseTimeout("no answer within 22s", None, 1)

    result = run_diagnosis(FakeDriver(overrides={"trace": stuck}), options)
    trace = result.phase("trace")
    assert trace.status == "timed_out"
    assert "called 1 time(s)" in trace.reason
    assert statuses(result)["census-after"] == "ok"
    assert trace.data["where_time_goes"]["calls"] == 1  # what did arrive is kept


def test_a_failing_phase_is_reported_with_the_agent_message(options: DiagnoseOptions) -> None:
    def broken(words: list[str], on_event: Any) -> dict[str, Any]:
        raise RemoteCommandError("profiler already running in this process", "stop it first")

    result = run_diagnosis(FakeDriver(overrides={"torch profile": broken}), options)
    profile = result.phase("profile")
    assert profile.status == "failed"
    assert profile.reason == "profiler already running in this process (stop it first)"
    assert statuses(result)["watch"] == "ok"


def test_a_census_that_read_nothing_at_an_unsafe_moment_is_taken_again(
        options: DiagnoseOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    # A DDP rank waiting in backward's all-reduce for a peer busy elsewhere (rank 0's
    # validation): the agent reads nothing and says to retry; the census is taken a moment later.
    import flight_profiler.diagnose.workflow as workflow

    monkeypatch.setattr(workflow, "CENSUS_RETRY_S", 0.01)
    driver = FakeDriver()
    refused = [0]
    fallback = driver.run

    def tensors(words: list[str], on_event: Any) -> dict[str, Any]:
        if refused[0] < 2:
            refused[0] += 1
            raise RemoteCommandError(
                "tensor census: thread 'MainThread' stayed inside one native call in "
                "_engine_run_backward() at graph.py:979 for over 2s (a long torch op, or a C "
                "extension); reading tensors while it runs could crash the process, so nothing was read",
                "retry when that call has returned")
        del driver.overrides["torch tensors"]
        try:
            return fallback(parse(shlex.join(words)), on_event)
        finally:
            driver.overrides["torch tensors"] = tensors

    driver.overrides["torch tensors"] = tensors
    result = run_diagnosis(driver, options)
    before = result.phase("census-before")
    assert before.status == "ok" and len(before.data["retried"]) == 2, before.data
    assert statuses(result)["census-middle"] == statuses(result)["census-after"] == "ok"


def test_a_census_that_fails_for_good_is_not_retried(options: DiagnoseOptions) -> None:
    calls = [0]

    def refused(words: list[str], on_event: Any) -> dict[str, Any]:
        calls[0] += 1
        raise RemoteCommandError("tensor census: out of memory", "free some memory")

    result = run_diagnosis(FakeDriver(overrides={"torch tensors": refused}), options)
    assert result.phase("census-before").status == "failed"
    assert calls[0] == 3  # before, middle, after: once each


def test_no_method_profiles_a_window_and_skips_method_phases(options: DiagnoseOptions) -> None:
    options.target = None
    driver = FakeDriver()
    result = run_diagnosis(driver, options)
    st = statuses(result)
    assert st["locate"] == st["record"] == st["watch"] == st["trace"] == "skipped"
    assert "no method given" in result.phase("watch").reason
    assert any(ln.startswith("torch profile --duration 0.1 --steps 4 -f ") for ln in driver.lines)


def _window(steps: dict[str, int], classes: dict[str, str], window_s: float | None = None) -> Handler:
    def profile(words: list[str], on_event: Any) -> dict[str, Any]:
        shutil.copy(TRACES / "cpu_only_tiny.json.gz", words[words.index("-f") + 1])
        return {"mode": "window", "duration_s": 1.5, "optimizer_steps": steps,
                "optimizer_classes": classes, **({"window_s": window_s} if window_s else {})}
    return profile


def test_the_window_steps_rate_is_measured_on_the_window_not_its_stop(options: DiagnoseOptions) -> None:
    # duration_s takes in torch's post-processing at the stop (seconds for a dense window)
    options.target = None
    driver = FakeDriver(overrides={"torch profile": _window(
        {"#0 Adam": 4}, {"#0 Adam": "torch.optim.adam.Adam"}, window_s=0.5)})
    result = run_diagnosis(driver, options)
    assert "Adam.step (4 steps in 0.5s)" in result.phase("profile").data["step"]


def test_no_method_measures_gradients_after_the_step_the_window_found(options: DiagnoseOptions) -> None:
    # a GAN's two optimizers: the one that stepped least is the step (the generator's)
    options.target = None
    driver = FakeDriver(overrides={"torch profile": _window(
        {"#0 Adam": 12, "#1 AdamW": 6}, {"#0 Adam": "torch.optim.adam.Adam",
                                         "#1 AdamW": "torch.optim.adamw.AdamW"})})
    result = run_diagnosis(driver, options)
    [grads] = [ln for ln in driver.lines if ln.startswith("torch grads")]
    assert grads.startswith("torch grads torch.optim.adamw AdamW step -n 3 "), grads
    assert "AdamW.step (6 steps in 1.5s)" in result.phase("profile").data["step"]
    # the live look at the loop follows the models' forwards, as with the step named
    [loop] = [ln for ln in driver.lines if ln.startswith("torch dataloader")]
    assert loop.startswith("torch dataloader torch.optim.adamw AdamW step --sample "), loop
    # AND, no DataLoader alive, it looks for 5 of that step's periods (6 in 1.5 s), not 3 s
    assert loop.endswith("--sample-if-none 1.25"), loop


@pytest.mark.parametrize("steps,classes", [
    ({}, {}),                                                      # no optimizer (a hand-written update)
    ({"#0 LBFGS": 1}, {"#0 LBFGS": "torch.optim.lbfgs.LBFGS"}),     # one step in the window: too slow
    ({"#0 Opt": 9}, {"#0 Opt": "train.<locals>.Opt"}),             # a class no command can name
])
def test_no_method_without_a_usable_step_measures_at_safe_points(options: DiagnoseOptions, steps: Any,
                                                                 classes: Any) -> None:
    options.target = None
    driver = FakeDriver(overrides={"torch profile": _window(steps, classes)})
    run_diagnosis(driver, options)
    [grads] = [ln for ln in driver.lines if ln.startswith("torch grads")]
    assert grads.startswith("torch grads -n 3 -i 1"), grads
    # nothing to follow (no step to name), and without a DataLoader no finding reads the
    # stacks sampled: 1 s, not 3
    [loop] = [ln for ln in driver.lines if ln.startswith("torch dataloader")]
    assert loop == "torch dataloader --sample 3 --sample-if-none 1", loop


def test_a_window_step_that_is_not_called_falls_back_to_safe_points(options: DiagnoseOptions) -> None:
    options.target = None
    fallback = FakeDriver()

    def grads(words: list[str], on_event: Any) -> dict[str, Any]:
        if "step" in words:
            raise RemoteCommandError("no call of torch.optim.sgd.SGD.step within 3 s", "")
        return fallback.run(parse(shlex.join(words)), on_event)

    driver = FakeDriver(overrides={"torch profile": _window({"#0 SGD": 8}, {"#0 SGD": "torch.optim.sgd.SGD"}),
                                   "torch grads": grads})
    result = run_diagnosis(driver, options)
    phase = result.phase("grads")
    assert phase.status == "ok" and "measured at safe points instead" in phase.data["window_step"]
    assert [ln.split(" -f ")[0] for ln in driver.lines if ln.startswith("torch grads")] == [
        "torch grads torch.optim.sgd SGD step -n 3", "torch grads -n 3 -i 1"]


def test_progress_names_the_phase_and_counts_the_calls(options: DiagnoseOptions) -> None:
    progress = Recorder()
    run_diagnosis(FakeDriver(), options, progress)
    assert progress.lines[0] == "phase 1/15 Check the target (torch, CUDA)"
    assert "waiting waiting for train_step to be called: 3 of 4 calls" in progress.lines
    assert "waiting 4 of 4 calls seen; the agent is finishing (writing its files)" in progress.lines
    assert progress.lines[-1] == "done report ok"
    assert sum(1 for ln in progress.lines if ln.startswith("phase ")) == 15


def test_partial_calls_are_kept_and_said(options: DiagnoseOptions) -> None:
    def three(words: list[str], on_event: Any) -> dict[str, Any]:
        for n in range(3):
            on_event({"type": "call", "n": n + 1, "cost_ms": 5.0})
        return {"reason": "timeout", "matched": 3}

    result = run_diagnosis(FakeDriver(overrides={"watch __main__ train_step --expr cost -n 4": three}),
                           options)
    watch = result.phase("watch")
    assert watch.status == "ok"
    assert watch.reason == "partial: 3 of 4 calls within the time limit"
    assert watch.data["cost"]["calls"] == 3


def test_outputs_are_complete_files(options: DiagnoseOptions) -> None:
    run_diagnosis(FakeDriver(), options)
    leftovers = [n for n in os.listdir(options.out_dir) if re.search(r"\.tmp$", n)]
    assert leftovers == []


def test_an_output_directory_with_spaces_is_quoted(tmp_path: Path) -> None:
    options = DiagnoseOptions(pid=4242, out_dir=str(tmp_path / "my runs" / "diag 1"),
                              target=MethodTarget.parse(["__main__", "train_step"]), calls=2,
                              duration=0.1, timeout=7.0)
    driver = FakeDriver()
    result = run_diagnosis(driver, options)
    assert statuses(result)["census-after"] == "ok"
    assert f"torch tensors __main__ train_step -f '{options.out_dir}/census-before.json' --timeout 7" \
        in driver.lines
    assert (Path(options.out_dir) / "profile.json.gz").exists()
    assert result.phase("profile").files == [f"{options.out_dir}/profile.json.gz"]


def slow_loader_watch(words: list[str], on_event: Any) -> dict[str, Any]:
    """11 ms calls, one every 300 ms: the loop is waiting elsewhere."""
    count = int(words[words.index("-n") + 1])
    for n in range(count):
        on_event({"type": "call", "n": n + 1, "cost_ms": 11.0, "ts": 1000.0 + 0.3 * n,
                  "thread": "MainThread"})
    return {"reason": "count", "matched": count, "target": "__main__.train_step"}


def slow_loader_state(words: list[str], on_event: Any) -> dict[str, Any]:
    workers = [{"worker_id": i, "pid": 100 + i, "state": "running", "cpu_percent": 99.0,
                "rss_bytes": 50 << 20} for i in range(2)]
    return {"cpus": 16, "sampled_s": 1.5, "loaders": [{
        "type": "DataLoader", "dataset": {"type": "train.SlowImages", "length": 5000},
        "batch_size": 32, "num_workers": 2, "pin_memory": False, "prefetch_factor": 2,
        "persistent_workers": False,
        "iterators": [{"type": "_MultiProcessingDataLoaderIter", "batches_in_flight": 4,
                       "batches_yielded": 40, "workers": workers}]}],
        "threads": [{"thread": "MainThread", "samples": 150,
                     "shares": {"dataloader_wait": 0.93, "running": 0.07},
                     "top": [{"category": "dataloader_wait", "share": 0.93,
                              "where": "DataLoader __next__ waiting for worker batches "
                                       "(called at train() train.py:40)"}]}]}


def test_input_bound_method_names_the_wait_and_fixes_from_the_real_settings(
        options: DiagnoseOptions) -> None:
    # GIVEN a method of 11 ms called every 300 ms while the loop waits in DataLoader __next__
    driver = FakeDriver(overrides={"watch __main__ train_step --expr cost -n 4": slow_loader_watch,
                                   "torch dataloader": slow_loader_state})
    result = run_diagnosis(driver, options)
    # THEN the stacks were sampled for several loop periods (2 s at least with a method: its
    # calls' graphs are followed meanwhile), and the finding says where and why
    assert any(ln.startswith("torch dataloader __main__ train_step --sample 2") for ln in driver.lines)
    found = [f for f in result.report.findings if f.rule == "dataloader-bottleneck"]
    assert len(found) == 1
    f = found[0]
    assert f.severity == "critical" and "4%" in f.title
    assert "train() train.py:40" in f.where[0]
    # The fix starts from num_workers=2 and the workers' CPU, and says what to set
    assert "`num_workers=2`" in f.fix[0] and "99%" in f.fix[0] and "num_workers=" in f.fix[0]
    needed = -(-2 * 300 // 11)  # each worker needs 600 ms per batch, the step takes 11 ms
    assert f"about {needed} workers" in f.fix[0] and "16 CPUs" in f.fix[0] and "busy" in f.fix[0]
    assert any("persistent_workers=True" in line for line in f.fix)


def test_a_busy_method_is_not_called_input_bound(options: DiagnoseOptions) -> None:
    result = run_diagnosis(FakeDriver(overrides={"torch dataloader": slow_loader_state}), options)
    assert result.phase("watch").data["loop"]["busy_share"] > 0.5
    assert not [f for f in result.report.findings if f.rule == "dataloader-bottleneck"]


def test_failed_phases_give_exit_12_and_the_report_names_the_missing_evidence(
        options: DiagnoseOptions, capsys: Any) -> None:
    from flight_profiler.cli.diagnose_cmd import finish

    def unreadable(words: list[str], on_event: Any) -> dict[str, Any]:
        raise RemoteCommandError("tensor census: thread 'server' stayed inside one native call",
                                 "retry when that call has returned")

    result = run_diagnosis(FakeDriver(overrides={"torch tensors": unreadable}), options)
    with pytest.raises(FlightProfilerError) as exited:
        finish(result, None, as_json=False)
    assert exited.value.exit_code == 12
    md = Path(result.outputs["md"]).read_text()
    assert "### Missing evidence" in md
    assert "leaks of small tensors, who holds them" in md
    out = capsys.readouterr()
    assert "incomplete" in out.err


def test_slow_but_idle_workers_are_told_to_multiply_past_the_cpu_count(
        options: DiagnoseOptions) -> None:
    def waiting_workers(words: list[str], on_event: Any) -> dict[str, Any]:
        state = slow_loader_state(words, on_event)
        state["cpus"] = 2
        for w in state["loaders"][0]["iterators"][0]["workers"]:
            w["cpu_percent"], w["state"] = 1.0, "sleeping"
        return state

    driver = FakeDriver(overrides={"watch __main__ train_step --expr cost -n 4": slow_loader_watch,
                                   "torch dataloader": waiting_workers})
    (f,) = [f for f in run_diagnosis(driver, options).report.findings
            if f.rule == "dataloader-bottleneck"]
    assert "barely use the CPU" in f.fix[0] and "`num_workers=32`" in f.fix[0]


def test_a_loop_that_sleeps_between_calls_is_named_as_such(options: DiagnoseOptions) -> None:
    def sleeping(words: list[str], on_event: Any) -> dict[str, Any]:
        return {"cpus": 2, "sampled_s": 1.5, "loaders": [], "threads": [
            {"thread": "MainThread", "samples": 100, "shares": {"sleep": 0.96, "running": 0.04},
             "top": [{"category": "sleep", "share": 0.96, "where": "sleep at main() train.py:12"}]}]}

    driver = FakeDriver(overrides={"watch __main__ train_step --expr cost -n 4": slow_loader_watch,
                                   "torch dataloader": sleeping})
    findings = run_diagnosis(driver, options).report.findings
    (f,) = [f for f in findings if f.rule == "idle-loop"]
    assert f.severity == "warning" and "sleeping" in f.title and "train.py:12" in f.where[0]
    assert not [f for f in findings if f.rule == "dataloader-bottleneck"]


def test_a_trace_based_dataloader_finding_gets_the_fix_from_the_real_settings(
        options: DiagnoseOptions) -> None:
    # GIVEN no method (a time window) whose trace shows DataLoader waits, and a live loader
    options.target = None
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "traces" / "cpu_dataloader.json.gz"

    def window(words: list[str], on_event: Any) -> dict[str, Any]:
        shutil.copy(fixture, words[words.index("-f") + 1])
        return {"path": words[words.index("-f") + 1]}

    driver = FakeDriver(overrides={"torch profile": window, "torch dataloader": slow_loader_state})
    result = run_diagnosis(driver, options)
    (f,) = [f for f in result.report.findings if f.rule == "dataloader-bottleneck"]
    # THEN its first fix starts from num_workers=2 (not a generic "use num_workers=N")
    assert f.fix[0].startswith("`num_workers=2`")
    assert any("persistent_workers=True" in line for line in f.fix)


def test_grads_phase_feeds_the_report_the_missing_zero_grad(options: DiagnoseOptions) -> None:
    driver = FakeDriver()
    driver.zero_grad = False
    result = run_diagnosis(driver, options)
    assert result.phase("grads").status == "ok"
    assert result.phase("grads").files == [f"{options.out_dir}/grads.json"]
    assert result.report is not None
    acc = [f for f in result.report.findings if f.metrics.get("pattern") == "grads-accumulating"]
    assert acc and acc[0].severity == "critical" and "__main__.model" in acc[0].title


def test_nan_grads_lead_to_one_anomaly_call(options: DiagnoseOptions) -> None:
    def nan_grads(words: list[str], on_event: Any) -> dict[str, Any]:
        doc = grads_doc(int(words[words.index("-n") + 1]))
        doc["measurements"][-1]["models"][0].update(grad_norm="nan", nonfinite_grad_layers=1,
                                                    layers=[["nan", "nan", 10, 0, 1.0]])
        Path(words[words.index("-f") + 1]).write_text(json.dumps(doc))
        return doc

    def anomaly(words: list[str], on_event: Any) -> dict[str, Any]:
        state = {"enabled": False, "check_nan": True}
        return {"calls_recorded": 1, "anomaly_before": state, "anomaly_after": state,
                "first": {"op": "aten.log.default", "phase": "forward", "forward_stack": ["train.py:12 in step"]}}

    driver = FakeDriver(overrides={"torch grads": nan_grads, "torch anomaly": anomaly})
    result = run_diagnosis(driver, options)
    assert "torch anomaly __main__ train_step -n 1 --timeout 7" in driver.lines
    grads = result.phase("grads")
    assert grads.data["anomaly"] == {"first": anomaly([], None)["first"], "restored": True}
    assert grads.command.endswith("; torch anomaly __main__ train_step -n 1 --timeout 7")
    assert result.report is not None
    nf = [f for f in result.report.findings if f.metrics.get("pattern") == "non-finite"]
    assert nf and nf[0].metrics["first_layer"] == "weight"
    assert "forward call: train.py:12 in step" in nf[0].where
    assert any("aten.log.default in forward" in line for line in nf[0].evidence)


# -- the step, and the loop around the method (issue 18) -------------------------------------
def forward_watch(words: list[str], on_event: Any) -> dict[str, Any]:
    """A forward of 16 ms in a 100 ms step (the rest: backward, optimizer, the next batch)."""
    count = int(words[words.index("-n") + 1])
    for n in range(count):
        on_event({"type": "call", "n": n + 1, "cost_ms": 16.0, "ts": 1000.0 + 0.1 * n,
                  "thread": "MainThread"})
    return {"reason": "count", "matched": count, "target": "__main__.Generator.forward"}


def training_samples(words: list[str], on_event: Any, share: float = 0.02,
                     batches: int = 20) -> dict[str, Any]:
    """A training loop's thread: running its backward and its model, next() timed."""
    return {"cpus": 2, "sampled_s": 2.0, "loaders": [], "threads": [{
        "thread": "MainThread", "samples": 200,
        "shares": {"running": 1.0 - share, "dataloader_wait": share},
        "top": [{"category": "running", "share": 0.5,
                 "where": "running _engine_run_backward() graph.py:979 (in <module>() dcgan.py:157)"},
                {"category": "running", "share": 0.3, "where": "running forward() conv.py:1198"}]}],
        "next_timing": [{"thread": "MainThread", "batches": batches, "next_s": share * 2.0,
                         "window_s": 2.0, "share": share}]}


def window_profile(loop_kwargs: dict[str, Any]) -> Handler:
    def handler(words: list[str], on_event: Any) -> dict[str, Any]:
        from unit.report.step_synth import Loop, write

        write(Loop(**loop_kwargs), Path(words[words.index("-f") + 1]))
        return {"path": words[words.index("-f") + 1], "mode": "around", "calls_entered": 7,
                "optimizer_steps": {"#0 SGD": 7}, "duration_s": 0.1}
    return handler


def test_the_rest_of_a_step_is_no_idle_loop_and_backward_is_never_to_remove(
        options: DiagnoseOptions) -> None:
    # GIVEN Generator.forward, 16 % of its loop, whose thread runs backward the rest of the time
    options.target = MethodTarget.parse(["__main__", "Generator", "forward"])
    driver = FakeDriver(overrides={"watch __main__ Generator forward --expr cost -n 4": forward_watch,
                                   "torch dataloader": training_samples,
                                   "torch profile": window_profile({"steps": 6})})
    result = run_diagnosis(driver, options)
    findings = result.report.findings
    # THEN no idle-loop (the old verdict: "only 16% of its loop ... remove it", at backward)
    assert not [f for f in findings if f.rule == "idle-loop"]
    assert not [f for f in findings if "remove" in " ".join(f.fix).lower() and "backward" in
                " ".join(f.where)]
    # and the step it runs in is said: in --json and diagnose.json
    step = result.to_dict()["step"]
    assert step["kind"] == "optimizer" and step["name"] == "SGD.step"
    assert step["method"]["role"] == "inside the step" and step["method"]["calls_per_step"] == 1
    written = json.loads((Path(options.out_dir) / "diagnose.json").read_text())
    assert written["step"] == step and "The step: SGD.step" in Path(result.outputs["md"]).read_text()


def test_the_dataloader_share_timed_without_the_profiler_decides(options: DiagnoseOptions) -> None:
    # GIVEN a profile whose whole steps put 25 % in next() (the profiler slows the training
    # thread's own Python in __next__), while the loop's next() calls, timed, take 3 %
    driver = FakeDriver(overrides={"torch dataloader": lambda w, e: training_samples(w, e, 0.03),
                                   "torch profile": window_profile({"steps": 6, "dataloader_us": 2500})})
    result = run_diagnosis(driver, options)
    # THEN the timed share is the verdict: no DataLoader finding, and both figures are said
    assert not [f for f in result.report.findings if f.rule == "dataloader-bottleneck"]
    dl = result.to_dict()["dataloader"]
    assert dl["timed_pct"] == 3.0 and dl["profile_pct"] > 20
    # WHEN the timed share is high THEN it is a finding that says how it was measured
    driver = FakeDriver(overrides={"torch dataloader": lambda w, e: training_samples(w, e, 0.3),
                                   "torch profile": window_profile({"steps": 6})})
    (f,) = [f for f in run_diagnosis(driver, options).report.findings
            if f.rule == "dataloader-bottleneck"]
    assert f.severity == "critical" and "timed without the profiler" in f.evidence[0]


def test_a_job_report_takes_each_ranks_timed_dataloader_share(options: DiagnoseOptions) -> None:
    # GIVEN a rank whose profile puts 25 % of its steps in next() (a validation loader's
    # batches in the window, slowed by the profiler), while its loop's next() calls, timed,
    # take 3 %: its own report says nothing (test above)
    from flight_profiler.diagnose.evidence import merge_rank_loader
    from flight_profiler.report import analyze

    driver = FakeDriver(overrides={"torch dataloader": lambda w, e: training_samples(w, e, 0.03),
                                   "torch profile": window_profile({"steps": 6, "dataloader_us": 2500})})
    result = run_diagnosis(driver, options)
    profile = str(Path(options.out_dir) / "profile.json.gz")
    # WHEN the job's report is made from the ranks' files (diagnose --all-ranks)
    job = analyze([profile])
    assert [f for f in job.findings if f.rule == "dataloader-bottleneck"]  # the trace alone says so
    merged = merge_rank_loader(result, job.findings, 0)
    # THEN the rank's timed share decides there too
    assert not [f for f in merged if f.rule == "dataloader-bottleneck"]
    assert [f.rule for f in merged] == [f.rule for f in job.findings if f.rule != "dataloader-bottleneck"]
    # and a rank whose timed share is high keeps a finding that says its rank and how it was timed
    driver = FakeDriver(overrides={"torch dataloader": lambda w, e: training_samples(w, e, 0.3),
                                   "torch profile": window_profile({"steps": 6, "dataloader_us": 2500})})
    result = run_diagnosis(driver, options)
    (f,) = [f for f in merge_rank_loader(result, analyze([profile]).findings, 1)
            if f.rule == "dataloader-bottleneck"]
    assert f.ranks == [1] and "timed without the profiler" in f.evidence[0]
    assert any(line.startswith("in the profile: ") for line in f.evidence)


def _uncalled(words: list[str], on_event: Any) -> dict[str, Any]:
    on_event({"type": "watching"})
    return {"reason": "timeout", "matched": 0, "target": "__main__.train_step"}


def _backwards(n: int) -> Handler:
    def watch(words: list[str], on_event: Any) -> dict[str, Any]:
        return {"reason": "count" if n >= 3 else "timeout", "matched": n,
                "target": "torch.autograd.backward"}
    return watch


def test_a_method_the_training_loop_never_calls_is_given_up_at_once(options: DiagnoseOptions) -> None:
    # a LightningModule's forward: Lightning runs training_step; the loop trains meanwhile
    options.timeout = 30.0
    driver = FakeDriver(overrides={"watch __main__ train_step": _uncalled,
                                   "watch torch.autograd backward": _backwards(3)})
    result = run_diagnosis(driver, options)
    locate = result.phase("locate")
    assert locate.status == "skipped" and "3 backward passes" in locate.reason
    watches = [ln for ln in driver.lines if ln.startswith("watch")]
    assert watches[:2] == ["watch __main__ train_step --expr cost -n 1 --timeout 5",
                           "watch torch.autograd backward -n 3 --timeout 2"]
    assert not any(ln.startswith("watch __main__ train_step") for ln in watches[2:])
    assert any(ln.startswith("torch profile --duration") for ln in driver.lines)  # a window instead


def test_a_method_not_called_while_nothing_trains_is_waited_for_up_to_the_timeout(
        options: DiagnoseOptions) -> None:
    options.timeout = 30.0
    driver = FakeDriver(overrides={"watch __main__ train_step": _uncalled,
                                   "watch torch.autograd backward": _backwards(0)})
    result = run_diagnosis(driver, options)
    assert result.phase("locate").status == "skipped"
    watches = [ln for ln in driver.lines if ln.startswith("watch __main__ train_step")]
    assert watches[:2] == ["watch __main__ train_step --expr cost -n 1 --timeout 5",
                           "watch __main__ train_step --expr cost -n 1 --timeout 25"]


def test_a_call_that_outlasts_the_diagnosis_is_named_running(options: DiagnoseOptions) -> None:
    # a PINN's one LBFGS step of max_iter=50000, named: entered minutes ago, never returns
    options.timeout = 30.0
    options.target = MethodTarget.parse(["torch.optim.lbfgs", "LBFGS", "step"])

    def stack(words: list[str], on_event: Any) -> dict[str, Any]:
        return {"threads": [{"name": "MainThread", "frames": [
            {"file": "/work/pinn.py", "function": "PhysicsInformedNN.train", "line": 120},
            {"file": "/venv/lib/python3.11/site-packages/torch/optim/lbfgs.py",
             "function": "LBFGS.step", "line": 440}]}]}

    driver = FakeDriver(overrides={"watch torch.optim.lbfgs LBFGS step": _uncalled, "stack": stack})
    result = run_diagnosis(driver, options)
    locate = result.phase("locate")
    assert locate.status == "skipped" and "is running (thread MainThread at lbfgs.py:440)" in locate.reason
    assert not any(ln.startswith("watch torch.autograd") for ln in driver.lines)
    assert "is running" in result.phase("watch").reason


def test_the_dataloader_share_over_whole_epochs_is_the_figure_when_the_window_saw_a_start(
        options: DiagnoseOptions) -> None:
    # GIVEN a window whose batches waited 3 % of the loop, and whose loaders restart their
    # workers at a cost that makes the loop wait 30 % over whole epochs (NextTimer's figure)
    def samples(words: list[str], on_event: Any) -> dict[str, Any]:
        data = training_samples(words, on_event, 0.03)
        data["next_timing"][0].update({"starts": 1, "start_s": 0.02, "epoch_batches": 10,
                                       "start_cost_s": 0.5, "share_epochs": 0.30})
        return data

    driver = FakeDriver(overrides={"torch dataloader": samples,
                                   "torch profile": window_profile({"steps": 6})})
    result = run_diagnosis(driver, options)
    # THEN the epochs' share is the verdict and the figure said, with the window's beside it
    assert result.to_dict()["dataloader"]["timed_pct"] == 30.0
    (f,) = [f for f in result.report.findings if f.rule == "dataloader-bottleneck"]
    assert f.severity == "critical" and "30.0% over whole epochs (a start of 0.500 s" in f.evidence[0]
    assert ": 3.0% of the loop" in f.evidence[0]
