"""torch anomaly: names the op and the line that made the first NaN, in forward or backward,
and leaves the process-wide anomaly flags exactly as it found them. In-process harness: the
handler runs in its own thread, the test thread plays the training loop."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler, spec  # noqa: E402

from flight_profiler.agent import hooks, nan_watch  # noqa: E402
from flight_profiler.agent.registry import CommandError  # noqa: E402

LOOP = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return torch.log(h - 1000.0)  # FORWARD-NAN: log of negatives

def bad_forward_step():
    net = Net()
    net(torch.randn(8, 4)).sum().backward()

def bad_backward_step():
    x = torch.zeros(3, requires_grad=True)
    y = torch.sqrt(x)  # BACKWARD-INF: d sqrt / dx at 0
    y.sum().backward()

def nan_data_then_log_step(batch):
    x = batch * 2.0                  # a NaN that came with the data: no op made it
    y = torch.log(torch.ones(3) - 2.0)  # ORIGIN-NAN: log of a negative number
    return x.sum() + y.sum()

def good_step():
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()
"""


@pytest.fixture
def loop():
    module = types.ModuleType("fp_anomaly_workload")
    module.__file__ = "/tmp/fp_anomaly_workload.py"
    with open(module.__file__, "w") as fh:
        fh.write(textwrap.dedent(LOOP))
    sys.modules[module.__name__] = module
    exec(compile(textwrap.dedent(LOOP), module.__file__, "exec"), module.__dict__)
    yield module
    sys.modules.pop(module.__name__, None)
    torch.set_anomaly_enabled(False, True)


def _run(loop: Any, method: str, calls: int = 1, **kw: Any) -> dict[str, Any]:
    fn = getattr(loop, method)
    result, _ = run_handler("torch anomaly", {"target": spec(loop.__name__, method), "calls": calls,
                                              "timeout": 20, **kw}, fn)
    return result


@pytest.mark.parametrize("before", [(False, True), (True, False), (True, True), (False, False)])
def test_flags_are_restored_exactly(loop, before):
    torch.set_anomaly_enabled(*before)
    result = _run(loop, "good_step", calls=2)
    assert (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == before
    assert result["calls_recorded"] == 2 and result["found"] is False
    assert result["anomaly_before"] == result["anomaly_after"] == {"enabled": before[0], "check_nan": before[1]}
    assert hooks.active() == [] and not nan_watch.BUSY.locked()


def test_forward_nan_names_op_and_line(loop):
    result = _run(loop, "bad_forward_step")
    first = result["first"]
    assert first["phase"] == "forward" and first["op"].startswith("aten.log"), first
    assert first["inputs_finite"] is True
    assert any("FORWARD-NAN" in line and "in forward" in line for line in first["forward_stack"]), first
    assert not torch.is_anomaly_enabled()


def test_backward_inf_names_backward_node_and_forward_line(loop):
    result = _run(loop, "bad_backward_step")
    first = result["first"]
    assert first["phase"] == "backward" and first["backward_node"] == "SqrtBackward0", first
    assert any("BACKWARD-INF" in line for line in first["forward_stack"]), first
    assert not torch.is_anomaly_enabled()


def test_a_nan_that_came_with_the_data_is_first_and_the_op_that_makes_one_is_the_origin(loop):
    batch = torch.tensor([1.0, float("nan")])
    fn = loop.nan_data_then_log_step
    result, _ = run_handler("torch anomaly", {"target": spec(loop.__name__, "nan_data_then_log_step"),
                                              "calls": 1, "timeout": 20}, lambda: fn(batch))
    first, origin = result["first"], result["origin"]
    assert first["op"].startswith("aten.mul") and first["inputs_finite"] is False, first
    assert origin["op"].startswith("aten.log") and origin["inputs_finite"] is True, origin
    assert any("ORIGIN-NAN" in line for line in origin["forward_stack"]), origin


def test_timeout_without_calls_restores_and_unlocks(loop):
    torch.set_anomaly_enabled(True, False)
    with pytest.raises(CommandError, match="no call"):
        run_handler("torch anomaly", {"target": spec(loop.__name__, "good_step"), "calls": 1, "timeout": 0.3})
    assert (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == (True, False)
    assert not nan_watch.BUSY.locked() and hooks.active() == []


def test_target_exception_still_restores(loop):
    def boom() -> None:
        torch.randn(2, requires_grad=True).sum().backward()
        raise ValueError("user bug")

    loop.boom = boom

    def drive() -> None:
        with contextlib.suppress(ValueError):
            loop.boom()
    result, _ = run_handler("torch anomaly", {"target": spec(loop.__name__, "boom"), "calls": 2, "timeout": 20}, drive)
    assert result["calls_recorded"] == 2
    assert (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == (False, True)


def test_generator_methods_are_refused_before_anything_changes(loop):
    def batches():
        yield torch.ones(1)

    loop.batches = batches
    with pytest.raises(CommandError, match="generator or coroutine"):
        run_handler("torch anomaly", {"target": spec(loop.__name__, "batches"), "calls": 1, "timeout": 1})
    assert (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == (False, True)
    assert hooks.active() == [] and not nan_watch.BUSY.locked()


def test_uninitialised_outputs_are_not_judged():
    # torch.empty's bits are whatever the allocator held (a CI run once saw NaN there and named
    # aten.empty.memory_format the first NaN): such outputs are not results.
    watch = nan_watch.make_watch(torch)
    nan = torch.tensor([float("nan"), 1.0])
    watch._check(torch.ops.aten.empty.memory_format, ([2],), {}, nan)
    watch._check(torch.ops.aten.new_empty_strided.default, (nan, [2], [1]), {}, nan)
    assert watch.first is None
    watch._check(torch.ops.aten.log.default, (torch.tensor([-1.0, 1.0]),), {}, nan)
    assert watch.first is not None and watch.first["op"] == "aten.log.default"
