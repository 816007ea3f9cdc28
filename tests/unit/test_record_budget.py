"""`torch memory -r --budget S`: the recording stops once the recorded calls took S seconds in
all (at least 2 calls), and says so. An actor-critic's finish_episode (a few ms) costs ~0.4 s a
call to record with stacks: 10 calls were 4.5 s of a diagnosis."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from torch_agent_helpers import run_handler, spec  # noqa: E402

from flight_profiler.errors import UsageError  # noqa: E402
from flight_profiler.requests import torch as torch_requests  # noqa: E402

MOD = "fp_test_record_budget"


def _module() -> types.ModuleType:
    mod = types.ModuleType(MOD)

    def step() -> None:
        x = torch.randn(64, 64)
        (x @ x).sum()
        time.sleep(0.05)

    mod.step = step  # type: ignore[attr-defined]
    sys.modules[MOD] = mod
    return mod


def test_the_recording_stops_at_its_budget_and_says_so(tmp_path: Path) -> None:
    mod = _module()
    try:
        result, _ = run_handler("torch memory", {
            "mode": "record", "target": spec(MOD, "step"), "calls": 20, "timeout": 30,
            "budget": 0.2, "path": str(tmp_path / "r.pickle"), "label": ""}, mod.step)
    finally:
        del sys.modules[MOD]
    # 50 ms a call: the budget ends it after 4 calls or so, never before 2, far before 20
    assert 2 <= result["calls_recorded"] <= 8 and result["budget_s"] == 0.2
    assert (tmp_path / "r.pickle").stat().st_size > 0


def test_without_a_budget_every_call_asked_is_recorded(tmp_path: Path) -> None:
    mod = _module()
    try:
        result, _ = run_handler("torch memory", {
            "mode": "record", "target": spec(MOD, "step"), "calls": 5, "timeout": 30,
            "path": str(tmp_path / "r.pickle"), "label": ""}, mod.step)
    finally:
        del sys.modules[MOD]
    assert result["calls_recorded"] == 5 and "budget_s" not in result


def test_the_budget_is_an_option_of_record_only() -> None:
    request = torch_requests.memory(("m", "f"), record=True, calls=10, budget=1.5)
    assert request.args["budget"] == 1.5 and "--budget 1.5" in request.line
    with pytest.raises(UsageError):
        torch_requests.memory(snapshot=True, budget=1.5)
