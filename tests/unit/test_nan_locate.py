"""arm --on nan, then the next step watched op by op (agent/triggers/nan_locate.py): the op and
line that make a NaN out of finite values are named; when the parameters were already poisoned,
the event says so; the dispatch mode and the anomaly flags never outlive the watched step, and a
disarm in the middle leaves nothing behind once the training thread steps again. In-process: the
test thread is the training loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from flight_profiler.agent import nan_watch  # noqa: E402
from flight_profiler.agent.registry import AgentState  # noqa: E402
from flight_profiler.agent.triggers import evidence  # noqa: E402
from flight_profiler.agent.triggers.armory import Armory  # noqa: E402
from flight_profiler.agent.triggers.nan import NanTrigger  # noqa: E402
from flight_profiler.report import analyze  # noqa: E402


def _post_hooks() -> int:
    import torch.optim.optimizer as o

    return len(o._global_optimizer_post_hooks)


def _event(root: Path) -> dict[str, Any]:
    (event,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    doc: dict[str, Any] = json.loads((event / "event.json").read_text())
    return doc


def _arm(tmp_path: Path) -> tuple[Armory, NanTrigger]:
    armory = Armory()
    trigger = NanTrigger(evidence.EvidenceDir(str(tmp_path / "ev"), 64 << 20), 1, {})
    armory.arm(trigger, AgentState(), None)
    return armory, trigger


def _fit(model: Any, opt: Any, steps: int, trigger: NanTrigger, bad_from: int, poison_once: bool) -> int:
    """A regression on log-targets, as users write it; from ``bad_from`` on, the data carry
    zeros (a bad shard): log(0) makes the loss infinite at every step, or only once."""
    after = 0
    for step in range(steps):
        x = torch.randn(16, 4)
        y = torch.rand(16, 1) + 0.5
        if step >= bad_from and (not poison_once or step == bad_from):
            y[0] = 0.0
        opt.zero_grad()
        loss = (model(x) - torch.log(y)).pow(2).mean()  # LOG-OF-TARGET
        loss.backward()
        opt.step()
        if trigger.fires:
            after += 1
            if after > 3:
                break
    return after


def _step_until_fired(model: Any, opt: Any, trigger: NanTrigger) -> None:
    """Train until the trigger fires; one gradient is poisoned once, at step 3."""
    for step in range(4000):
        opt.zero_grad()
        model(torch.randn(4, 4)).pow(2).mean().backward()
        if step == 3:
            model.bias.grad.fill_(float("nan"))
        opt.step()
        if trigger.fires:
            return


def test_the_next_step_names_the_op_and_line_of_a_nan_the_data_keep_making(tmp_path: Path) -> None:
    before = nan_watch.read_state(torch)
    hooks = _post_hooks()
    armory, trigger = _arm(tmp_path)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        assert _fit(model, opt, 4000, trigger, bad_from=8, poison_once=False) > 3
        doc = _event(tmp_path / "ev")
        loc = doc["located"]
        assert loc["watched"] and loc["found"] and loc["step"] == doc["step"] + 1, loc
        origin = loc["origin"]
        assert origin["op"].startswith("aten.log") and origin["phase"] == "forward", origin
        assert origin["inputs_finite"] is True and origin["inf"] >= 1
        assert "LOG-OF-TARGET" in origin["forward_stack"][-1], origin["forward_stack"]
        # nothing of the watch outlives its step
        assert torch._C._len_torch_dispatch_stack() == 0
        assert nan_watch.read_state(torch) == before
        report = analyze([str(tmp_path / "ev")])
        (finding,) = [f for f in report.findings if f.rule == "arm-nan"]
        assert "aten.log" in finding.root_cause and "LOG-OF-TARGET" in " ".join(finding.where)
        assert any("clamp" in fix for fix in finding.fix), finding.fix
    finally:
        armory.disarm()
    assert _post_hooks() == hooks and torch._C._len_torch_dispatch_stack() == 0


def test_parameters_poisoned_by_the_update_are_said_so(tmp_path: Path) -> None:
    armory, trigger = _arm(tmp_path)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        _fit(model, opt, 4000, trigger, bad_from=8, poison_once=True)
        loc = _event(tmp_path / "ev")["located"]
        assert loc["watched"] and not loc["found"] and loc["origin"] is None, loc
        assert loc["first_nonfinite"]["nonfinite_input_is_parameter"] is True, loc
        report = analyze([str(tmp_path / "ev")])
        (finding,) = [f for f in report.findings if f.rule == "arm-nan"]
        text = " ".join(finding.evidence)
        assert "no op made a NaN or Inf out of finite values" in text and "a parameter" in text, text
        assert any("torch anomaly" in fix for fix in finding.fix)
    finally:
        armory.disarm()


def test_a_disarm_in_the_watched_step_restores_at_once_and_pops_at_the_next_step(tmp_path: Path) -> None:
    before = nan_watch.read_state(torch)
    hooks = _post_hooks()
    armory, trigger = _arm(tmp_path)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _step_until_fired(model, opt, trigger)
    assert trigger.busy() and torch._C._len_torch_dispatch_stack() == 1, trigger.located
    assert torch.is_anomaly_enabled()
    # disarmed from another thread (the CLI's request): it cannot pop this thread's mode
    done = threading.Thread(target=armory.disarm)
    done.start()
    done.join(10)
    assert not trigger.busy()
    assert nan_watch.read_state(torch) == before  # the process-wide flags: back at once
    assert torch._C._len_torch_dispatch_stack() == 1  # the mode: a pass-through until the next step
    assert _post_hooks() == hooks + 1  # the hook that will pop it stays
    model(torch.randn(4, 4)).pow(2).mean().backward()
    opt.step()
    assert torch._C._len_torch_dispatch_stack() == 0
    assert _post_hooks() == hooks  # removed by the same step end
    loc = _event(tmp_path / "ev")["located"]
    assert loc["cut_short"] == "disarmed before the watched step ended", loc


def test_not_watched_under_a_dispatch_mode_of_the_job(tmp_path: Path) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class JobMode(TorchDispatchMode):  # the job's own mode, e.g. a FLOP counter
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    armory, trigger = _arm(tmp_path)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        with JobMode():
            _step_until_fired(model, opt, trigger)
            assert torch._C._len_torch_dispatch_stack() == 1  # the job's, not ours on top of it
        loc = _event(tmp_path / "ev")["located"]
        assert loc == {"step": 0, "watched": False,
                       "reason": "the training thread runs under a dispatch mode of its own"}, loc
        assert not trigger.busy()
    finally:
        armory.disarm()
    assert torch._C._len_torch_dispatch_stack() == 0
