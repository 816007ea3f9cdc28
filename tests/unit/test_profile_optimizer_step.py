"""`torch profile torch.optim.sgd SGD step -n 1 --window`: an optimizer's own step is a step by
definition, so no call is spent watching whether it holds one (the probe) before profiling.

In-process: the handler runs in its own thread, as in the agent; a training thread steps only
when the test lets it, so which call the profile gets is exact.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler, spec  # noqa: E402

from flight_profiler.agent import hook_registry  # noqa: E402


class Trainer:
    """SGD steps, one each time ``go`` is released."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.go = threading.Semaphore(0)
        self.steps = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.train, name="trainer", daemon=True)

    def train(self) -> None:
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        while not self.stop.is_set():
            if not self.go.acquire(timeout=0.05):
                continue
            self.optimizer.zero_grad()
            torch.nn.functional.mse_loss(self.model(x), y).backward()
            self.optimizer.step()
            self.steps += 1


def test_an_optimizers_step_is_profiled_from_its_next_call_without_a_probe(tmp_path: Path) -> None:
    trainer = Trainer()
    trainer.thread.start()
    trainer.go.release()  # one step first: torch wraps SGD.step with its hooks when it is built
    deadline = time.monotonic() + 10
    while trainer.steps < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    released = []

    def drive() -> None:
        # exactly one more step, once something hooks SGD.step: a probe would take that call
        # and leave the profile none within its timeout
        if not released and any("SGD.step" in d for d in hook_registry.active()):
            released.append(time.monotonic())
            trainer.go.release()

    path = tmp_path / "step.json"
    try:
        result, _ = run_handler("torch profile", {
            "target": spec("torch.optim.sgd", "step", "SGD"), "calls": 1, "window": True,
            "timeout": 3.0, "path": str(path), "row_limit": 0}, drive=drive, timeout=60)
    finally:
        trainer.stop.set()
        trainer.thread.join(30)
    assert len(released) == 1 and trainer.steps == 2
    assert result["holds_step"] is True and result["sessions"] == 1, result
    assert path.stat().st_size > 0
    assert not hook_registry.active()
