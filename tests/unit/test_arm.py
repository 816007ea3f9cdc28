"""`arm`: the grammar's one-line errors, the triggers in this process (a hang, the CUDA OOM
path with fakes, an uncaught MemoryError, a NaN after a real optimizer step), the evidence
directory's cap (oldest kept), and the report of an evidence directory."""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.agent.registry import AgentState
from flight_profiler.agent.triggers import evidence
from flight_profiler.agent.triggers.armory import Armory
from flight_profiler.agent.triggers.hang import HangTrigger
from flight_profiler.agent.triggers.oom import OomTrigger
from flight_profiler.errors import UsageError
from flight_profiler.report import analyze
from flight_profiler.requests import parse
from flight_profiler.requests.arm import parse_duration, parse_size


# -- grammar ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("line", "needle"), [
    ("arm --on hang --out /tmp/x", "needs SECONDS"),
    ("arm --on nan 5 --out /tmp/x", "takes no SECONDS"),
    ("arm --on oom --out /tmp/x --for 2x", "not a duration"),
    ("arm --on oom --out /tmp/x --rss-limit lots", "not a size"),
    ("arm --on hang 30 --out /tmp/x --rss-limit 1G", "--rss-limit goes with --on oom"),
    ("arm --on fire --out /tmp/x", "'fire' is not one of"),
    ("arm --on nan", "Missing option '--out'"),
    ("arm --on nan --out /tmp/x --max-fires 0", "--max-fires"),
    ("disarm --on nope", "'nope' is not one of"),
])
def test_bad_arm_lines_get_one_line_naming_the_cause(line: str, needle: str) -> None:
    with pytest.raises(UsageError) as info:
        parse(line)
    assert needle in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_sizes_and_durations() -> None:
    assert parse_size("12G") == 12 << 30 and parse_size("500MiB") == 500 << 20
    assert parse_size("4096") == 4096
    assert parse_duration("90") == 90 and parse_duration("30m") == 1800
    assert parse_duration("2h") == 7200 and parse_duration("1.5d") == 129600
    for bad in ("0", "-1", "1e9", "h"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# -- evidence directory ---------------------------------------------------------------------------
def _event(root: evidence.EvidenceDir, payload: bytes) -> str | None:
    event = root.begin("hang", None)
    event.write("blob.bin", lambda f: f.write(payload))
    return event.commit({"trigger": "hang"})


def test_cap_keeps_the_oldest_events_and_drops_the_newest(tmp_path: Path) -> None:
    root = evidence.EvidenceDir(str(tmp_path / "ev"), cap_bytes=evidence.MAX_EVENT_JSON + 600_000)
    first = _event(root, b"a" * 250_000)
    second = _event(root, b"b" * 250_000)
    third = _event(root, b"c" * 250_000)  # over the cap: its big file is dropped
    assert first and second and third
    assert (tmp_path / "ev" / first / "blob.bin").stat().st_size == 250_000
    doc = json.loads((tmp_path / "ev" / third / "event.json").read_text())
    assert doc["dropped"] == [{"file": "blob.bin", "bytes": 250_000}]
    while _event(root, b"d") is not None:  # fills up with small events, then refuses
        pass
    assert (tmp_path / "ev" / first / "blob.bin").exists()
    assert not [p for p in (tmp_path / "ev").iterdir() if p.name.startswith(".fp-arm-tmp")]
    root.close()


def test_a_linked_output_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(evidence.EvidenceError, match="symbolic link"):
        evidence.EvidenceDir(str(tmp_path / "link"), 1 << 20)


# -- triggers, in this process ----------------------------------------------------------------------
def _wait(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_hang_watches_the_threads_and_fires_once_per_hang(tmp_path: Path) -> None:
    armory, state = Armory(), AgentState()
    out = evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20)
    trigger = HangTrigger(out, 3, {}, seconds=1.0, threads="all")
    trigger.needs_clock = False
    release = threading.Event()
    waiter = threading.Thread(target=release.wait, name="stuck-worker", daemon=True)
    waiter.start()
    armory.arm(trigger, state, None)
    try:
        # every thread but the agent's is still for 3.5 s: one fire at ~1 s, then the same
        # hang does not fire again
        time.sleep(3.5)
        assert trigger.fires == 1
        (event,) = [p for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")]
        doc = json.loads((event / "event.json").read_text())
        assert doc["trigger"] == "hang" and doc["stalled_s"] >= 1.0
        assert "stuck-worker" in [t["thread"] for t in doc["threads"]]
        assert json.loads((event / "stacks.json").read_text())["threads"]
    finally:
        release.set()
        armory.disarm()
    assert state.active_hooks() == [] and armory.describe()["armed"] == []
    assert not armory.describe()["watcher"]


class _FakeCuda:
    def __init__(self) -> None:
        self.history: list[Any] = []
        self.memory = types.SimpleNamespace(
            _record_memory_history=lambda **kw: self.history.append(kw),
            _snapshot=lambda: {"segments": [], "device_traces": [[{"action": "oom", "size": 1 << 30}]]})

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return False


def test_cuda_oom_observer_writes_a_snapshot_and_history_is_turned_off_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _FakeCuda()
    observers: list[Any] = []
    fake = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(
        _cuda_attach_out_of_memory_observer=observers.append))
    monkeypatch.setitem(sys.modules, "torch", fake)
    out = evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20)
    trigger = OomTrigger(out, 1, {})
    notes = trigger.install()
    try:
        assert any("OOM observer attached" in n for n in notes)
        assert cuda.history == [{"enabled": "all", "max_entries": 100_000}]
        (observer,) = observers
        observer(0, 1 << 30, 5 << 30, 1 << 20)  # what torch calls at a failed allocation
        (event,) = [p for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")]
        doc = json.loads((event / "event.json").read_text())
        assert doc["signal"] == "cuda" and doc["alloc_bytes"] == 1 << 30
        assert (event / "memory_snapshot.pickle").stat().st_size > 0
        assert trigger.state == "spent"
        observer(0, 1, 1, 1)  # spent: nothing more
        assert len([p for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")]) == 1
    finally:
        left = trigger.remove()
    assert cuda.history[-1] == {"enabled": None}
    assert left == ["torch cannot detach an OOM observer: ours stays, doing nothing"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # it is the point
def test_uncaught_memory_error_fires_and_the_excepthooks_come_back(tmp_path: Path) -> None:
    before = (sys.excepthook, threading.excepthook)
    out = evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20)
    trigger = OomTrigger(out, 1, {})
    trigger.install()
    try:
        def grow() -> None:
            raise MemoryError("cannot allocate 8 GiB")

        worker = threading.Thread(target=grow, name="grower")
        worker.start()
        worker.join()
    finally:
        trigger.remove()
    assert (sys.excepthook, threading.excepthook) == before
    (event,) = [p for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")]
    doc = json.loads((event / "event.json").read_text())
    assert doc["signal"] == "exception" and "8 GiB" in doc["error"]
    assert doc["where"]["function"].endswith("grow")


def test_nan_trigger_names_the_step_and_the_parameter(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    armory, state = Armory(), AgentState()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    from flight_profiler.agent.triggers.nan import NanTrigger

    out = evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20)
    trigger = NanTrigger(out, 1, {})
    armory.arm(trigger, state, None)
    try:
        for step in range(3000):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            if step == 5:
                model[1].bias.grad.fill_(float("nan"))
            opt.step()
            if trigger.fires:
                break
        (event,) = [p for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")]
        doc = json.loads((event / "event.json").read_text())
        # checked every step at first (no step time yet), then paced: seen at step 6 or later,
        # after a clean check at step 5 or before
        assert doc["clean_at_step"] <= 5 < doc["step"], doc
        names = [p["name"] for p in doc["first_params"]]
        assert "1.bias" in names and set(names) <= {"0.weight", "0.bias", "1.weight", "1.bias"}
    finally:
        armory.disarm()
    import torch.optim.optimizer as o

    assert not o._global_optimizer_post_hooks and not o._global_optimizer_pre_hooks


def test_armed_steps_pay_one_post_hook_and_only_listeners_with_work(tmp_path: Path) -> None:
    # Every optimizer.step() of the job pays for what arm installs (issue 21: idle cost under
    # 1 %): one global post-step hook (no pre-step hook: no trigger needs the step's start),
    # and it calls only the triggers that do something per step (hang reads the step count from
    # its watcher; nan checks). The old clock installed a pre-hook too and called every trigger.
    torch = pytest.importorskip("torch")
    import torch.optim.optimizer as o

    from flight_profiler.agent.triggers.nan import NanTrigger

    armory, state = Armory(), AgentState()
    hang = HangTrigger(evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20), 1, {}, seconds=600.0)
    nan = NanTrigger(evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20), 1, {})
    calls: list[str] = []
    hang.on_post_step = lambda *a: calls.append("hang")  # type: ignore[method-assign]
    pre_before, post_before = len(o._global_optimizer_pre_hooks), len(o._global_optimizer_post_hooks)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    armory.arm(hang, state, None)
    armory.arm(nan, state, None)
    try:
        assert len(o._global_optimizer_pre_hooks) == pre_before
        assert len(o._global_optimizer_post_hooks) == post_before + 1
        assert armory.clock is not None and armory.clock.post_listeners == (nan,)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        assert calls == [] and armory.clock.steps == 3 and nan.checks >= 1
        assert armory.clock.thread == threading.get_ident()
        assert abs(armory.clock.last_step_wall - time.time()) < 60  # type: ignore[operator]
    finally:
        armory.disarm()
    assert len(o._global_optimizer_post_hooks) == post_before


# -- report ------------------------------------------------------------------------------------
def test_report_names_the_hang_line_and_ignores_the_stack_file(tmp_path: Path) -> None:
    event = tmp_path / "20260101-000000-hang-pid7-rank1-1"
    event.mkdir()
    (event / "stacks.json").write_text(json.dumps({"threads": []}))
    (event / "event.json").write_text(json.dumps({
        "format": "flight_profiler.arm_event", "trigger": "hang", "pid": 7, "rank": {"rank": 1},
        "step": 41, "stalled_s": 12.5, "params": {"seconds": 10},
        "where": {"file": "/job/train.py", "line": 88, "function": "main"},
        "threads": [{"thread": "MainThread", "where": {"file": "/job/train.py", "line": 88,
                                                       "function": "main"}}],
        "files": {"stacks.json": 10}, "fr": "torch.distributed is not initialised"}))
    result = analyze([str(tmp_path)])
    assert [i.kind for i in result.inputs] == ["arm_event"]
    (finding,) = [f for f in result.findings if f.rule == "arm-hang"]
    assert finding.where == ["/job/train.py:88"] and finding.ranks == [1]
    assert "after step 41" in finding.evidence[0]


def test_a_hostile_event_file_is_read_without_trusting_it(tmp_path: Path) -> None:
    (tmp_path / "event.json").write_text(json.dumps({
        "format": "flight_profiler.arm_event", "trigger": "nan", "rank": "x", "step": "7",
        "first_params": [{"name": 3, "shape": "big"}, "junk"], "files": [1], "where": [],
        "dropped": {"a": 1}}))
    result = analyze([str(tmp_path / "event.json")])
    (finding,) = [f for f in result.findings if f.rule == "arm-nan"]
    assert finding.metrics["step"] is None
    assert "group None param None" in finding.where[0]


def test_naming_the_parameters_hit_prints_no_warning_into_the_job() -> None:
    # isinstance() over gc's objects read torch.distributed.reduce_op's __class__, a deprecated
    # proxy: a FutureWarning in the job's stderr (seen on an H100 when a NaN trigger fired)
    import warnings

    import torch
    import torch.distributed  # the proxy lives there

    from flight_profiler.agent.triggers import nan

    net = torch.nn.Linear(3, 1)
    loose = torch.nn.Parameter(torch.zeros(1))  # in no module: the walk goes over every object
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nan._names(torch, [loose]) == {}
        assert nan._names(torch, [net.weight]) == {id(net.weight): "weight"}


def test_torch_cpu_allocator_failure_is_an_out_of_memory_error() -> None:
    """torch's CPU allocator raises a plain RuntimeError under RLIMIT_AS, not a MemoryError."""
    from flight_profiler.agent.triggers.oom import is_oom

    text = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 2097152 bytes. Error code 12 (Cannot allocate memory)")
    assert is_oom(RuntimeError(text))
    assert not is_oom(RuntimeError("shape mismatch: can't allocate a view"))
    assert not is_oom(ValueError(text))  # only torch's own error type carries it


def test_rss_dipping_just_under_the_limit_is_the_same_crossing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an RSS limit and a job whose RSS crosses it, dips just under (an allocator handing a
    # freed activation back), crosses again, then falls well below and crosses once more
    from flight_profiler.agent.triggers import capture

    readings = iter([90, 101, 98, 103, 80, 105])
    monkeypatch.setattr(capture, "rss_bytes", lambda: next(readings) << 20)
    out = evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20)
    trigger = OomTrigger(out, 5, {}, rss_limit=100 << 20)
    monkeypatch.setattr(trigger, "_capture", lambda event, doc, census: doc)
    for _ in range(6):
        trigger.tick(0.0)
    # THEN it fired for the first crossing and the one after the real fall, not for the dip
    events = sorted(p for p in (tmp_path / "ev").iterdir() if not p.name.startswith("."))
    assert [json.loads((e / "event.json").read_text())["rss_bytes"] >> 20 for e in events] == [101, 105]
