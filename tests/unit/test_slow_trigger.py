"""`arm --on slow FACTOR`: the grammar, the running median and when it judges (a fake clock),
a real fire in this process (a real optimizer, a real all-threads profile), and the report of
a slow event with its trace."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.agent.registry import AgentState
from flight_profiler.agent.triggers import evidence, slow
from flight_profiler.agent.triggers.armory import Armory
from flight_profiler.agent.triggers.slow import SlowTrigger
from flight_profiler.errors import UsageError
from flight_profiler.report import analyze
from flight_profiler.requests import parse
from flight_profiler.requests.arm import arm, parse_factor


# -- grammar ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("line", "needle"), [
    ("arm --on slow --out /tmp/x", "needs FACTOR"),
    ("arm --on slow 1 --out /tmp/x", "not a FACTOR above 1"),
    ("arm --on slow 0.5 --out /tmp/x", "not a FACTOR above 1"),
    ("arm --on slow 3y --out /tmp/x", "not a FACTOR above 1"),
    ("arm --on hang 30 --steps 3 --out /tmp/x", "go with --on slow"),
    ("arm --on slow 3 --steps 0 --out /tmp/x", "--steps"),
    ("arm --on slow 3 --steps 51 --out /tmp/x", "--steps"),
    ("arm --on slow 3 --rss-limit 1G --out /tmp/x", "--rss-limit goes with --on oom"),
])
def test_bad_slow_lines_get_one_line_naming_the_cause(line: str, needle: str) -> None:
    with pytest.raises(UsageError) as info:
        parse(line)
    assert needle in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_slow_lines_and_builders_round_trip(tmp_path: Path) -> None:
    assert parse_factor("3") == 3.0 and parse_factor("2.5x") == 2.5
    request = parse(f"arm --on slow 3x --steps 5 --out {tmp_path}")
    assert request.args == {"on": "slow", "out": str(tmp_path), "factor": 3.0, "steps": 5}
    built = arm("slow", str(tmp_path), factor=2.5, steps=4, max_fires=2)
    assert parse(built.line) == built, built.line
    hang = parse(f"arm --on hang 10m --out {tmp_path}")
    assert hang.args["seconds"] == 600.0  # SECONDS still read as a duration


# -- the median and when it judges (a fake clock, no torch) ----------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.steps = 0
        self.last_period: float | None = None
        self.last_step_wall: float | None = None

    def step(self, trigger: SlowTrigger, period: float) -> None:
        self.steps += 1
        self.last_period = period
        self.last_step_wall = time.time()
        trigger.on_post_step(self, None, True)


def _trigger(tmp_path: Path, factor: float = 3.0) -> tuple[SlowTrigger, list[Any]]:
    trigger = SlowTrigger(evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20), 1, {}, factor, 3)
    fired: list[Any] = []
    trigger._fire = lambda clock, period, median: fired.append((clock.steps, period, median))  # type: ignore[method-assign]
    return trigger, fired


def test_no_judgement_before_the_warm_up(tmp_path: Path) -> None:
    trigger, fired = _trigger(tmp_path)
    clock = FakeClock()
    for _ in range(slow.WARMUP - 1):
        clock.step(trigger, 0.01)
    clock.step(trigger, 1.0)
    clock.step(trigger, 1.0)  # 2 slow in a row, but the median is not ready until 20 steps
    assert fired == [] and trigger.median is not None
    assert trigger.median == pytest.approx(0.01)


def test_two_slow_steps_in_a_row_fire_one_alone_does_not(tmp_path: Path) -> None:
    trigger, fired = _trigger(tmp_path)
    clock = FakeClock()
    for _ in range(30):
        clock.step(trigger, 0.01)
    clock.step(trigger, 0.05)  # a checkpoint save, a GC pause: one step
    for _ in range(5):
        clock.step(trigger, 0.01)
    assert fired == []
    clock.step(trigger, 0.031)
    clock.step(trigger, 0.029)  # the second under 3x the median: not a run
    assert fired == []
    clock.step(trigger, 0.04)
    clock.step(trigger, 0.035)
    assert fired == [(clock.steps, 0.035, pytest.approx(0.01))]


def test_the_median_follows_the_job_and_ignores_spikes(tmp_path: Path) -> None:
    trigger, fired = _trigger(tmp_path)
    clock = FakeClock()
    for i in range(200):
        clock.step(trigger, 0.5 if i % 10 == 0 else 0.01)  # one step in 10 is an eval pass
    assert fired == [] and trigger.median == pytest.approx(0.01)
    for _ in range(slow.WINDOW):  # a new regime under FACTOR x the old: the median moves to it
        clock.step(trigger, 0.025)
    assert fired == [] and trigger.median == pytest.approx(0.025)
    clock.step(trigger, 0.06)
    clock.step(trigger, 0.06)  # 6x the old median, 2.4x the new one
    assert fired == []


def test_steps_while_profiling_and_after_a_fire_are_not_timed(tmp_path: Path) -> None:
    trigger, fired = _trigger(tmp_path)
    clock = FakeClock()
    for _ in range(25):
        clock.step(trigger, 0.01)
    trigger._skip = slow.WARMUP  # what _fire sets
    timed = trigger._added
    for _ in range(slow.WARMUP):
        clock.step(trigger, 1.0)
    assert trigger._added == timed and fired == []
    clock.step(trigger, 0.01)
    assert trigger._added == timed + 1


# -- a real fire in this process -------------------------------------------------------------
def test_a_real_slowdown_writes_a_trace_of_the_steps_after_it(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    armory, state = Armory(), AgentState()
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20)
    trigger = SlowTrigger(out, 1, {"rank": 3}, 3.0, 2)
    armory.arm(trigger, state, None)
    try:
        # until it has written (torch's first profile imports torch._inductor: 20 s and more
        # on a loaded 2-core machine), at most 3 minutes
        deadline = time.monotonic() + 180
        step = 0
        while not trigger.fires and time.monotonic() < deadline:
            time.sleep(0.2 if step >= 40 else 0.005)  # far apart: a loaded box stretches both
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            step += 1
        assert trigger.fires == 1
        (event,) = [p for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")]
        assert re.search(rf"-slow-pid{os.getpid()}-rank3-\d+$", event.name), event.name
        doc = json.loads((event / "event.json").read_text())
        assert doc["trigger"] == "slow" and doc["slow_step"] >= 40 and doc["factor"] == 3.0
        assert doc["slow_step_s"] > 3 * doc["median_s"] and len(doc["slow_run_s"]) == 2
        assert len(doc["profiled_step_s"]) == 2 and not doc["timed_out"]
        trace = json.loads((event / slow.TRACE_FILE).read_text())
        marks = [e for e in trace["traceEvents"]
                 if e.get("name", "").startswith("flight_profiler.optimizer_step#0 SGD")]
        assert len(marks) >= 3
        assert not any(t.name == slow.THREAD_NAME for t in threading.enumerate())
        result = analyze([str(tmp_path / "ev")])
        assert sorted(i.kind for i in result.inputs) == ["arm_event", "trace"]
        (finding,) = [f for f in result.findings if f.rule == "arm-slow"]
        assert finding.ranks == [3] and finding.where == [slow.TRACE_FILE]
    finally:
        armory.disarm()
    import torch.optim.optimizer as o

    assert not o._global_optimizer_post_hooks and not o._global_optimizer_pre_hooks


def test_disarm_while_profiling_stops_the_session_and_writes_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    armory, state = Armory(), AgentState()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trigger = SlowTrigger(evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20), 1, {}, 3.0, 50)
    armory.arm(trigger, state, None)
    try:
        deadline = time.monotonic() + 120
        step = 0
        while trigger.state != "firing" and time.monotonic() < deadline:
            time.sleep(0.3 if step >= 25 else 0.002)  # far apart: a loaded box stretches both
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            step += 1
        assert trigger.state == "firing"
        for _ in range(3):  # steps of the window being profiled
            opt.step()
    finally:
        armory.disarm()
    assert trigger.state == "disarmed" and trigger.fires == 1
    assert not any(t.name == slow.THREAD_NAME for t in threading.enumerate())
    assert [p for p in (tmp_path / "ev").iterdir()] == []
    assert torch.autograd.profiler._is_profiler_enabled is False


# -- report ------------------------------------------------------------------------------------
def test_report_names_the_slow_step_against_the_median(tmp_path: Path) -> None:
    event = tmp_path / "20260101-000000-slow-pid7-1"
    event.mkdir()
    (event / "event.json").write_text(json.dumps({
        "format": "flight_profiler.arm_event", "trigger": "slow", "pid": 7, "rank": {},
        "step": 130, "slow_step": 126, "slow_step_s": 0.42, "median_s": 0.105, "factor": 2.5,
        "profiled_step_s": [0.41, 0.44, 0.1], "steps_wanted": 3, "timed_out": False,
        "trace": "../../etc/slow_steps.pt.trace.json", "files": {"slow_steps.pt.trace.json": 9}}))
    result = analyze([str(event / "event.json")])
    (finding,) = [f for f in result.findings if f.rule == "arm-slow"]
    assert "step 126 took 420.0 ms, 4.0x the running median of 105.0 ms" in finding.summary
    assert "410.0, 440.0, 100.0 ms (2 still over 2.5x the median)" in " ".join(finding.evidence)
    assert finding.where == ["slow_steps.pt.trace.json"]  # a name, never a path out of it
    assert finding.metrics["ratio"] == 4.0


def test_a_hostile_slow_event_is_read_without_trusting_it(tmp_path: Path) -> None:
    (tmp_path / "event.json").write_text(json.dumps({
        "format": "flight_profiler.arm_event", "trigger": "slow", "slow_step_s": "fast",
        "median_s": 0, "profiled_step_s": "x", "trace": 5, "timed_out": "yes"}))
    result = analyze([str(tmp_path / "event.json")])
    (finding,) = [f for f in result.findings if f.rule == "arm-slow"]
    assert finding.metrics["ratio"] == 0.0 and finding.where == []
