"""`torch tensors torch.optim.lbfgs LBFGS step`: the census is taken at the end of the optimizer
step running when it is asked for (torch's step post-hook), not one whole step later; every
census of a series at that same moment, with the same roots.

In-process: the handler runs in its own thread, as in the agent; a training thread steps.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler, spec  # noqa: E402

from flight_profiler.agent import hook_registry  # noqa: E402

STEP_S = 0.3
LBFGS_STEP = spec("torch.optim.lbfgs", "step", "LBFGS")


class Trainer:
    """An LBFGS loop whose every step (one closure evaluation: max_iter=1) lasts STEP_S."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.x, self.y = torch.randn(8, 4), torch.randn(8, 1)
        self.optimizer = torch.optim.LBFGS(self.model.parameters(), max_iter=1)
        self.started: list[float] = []
        self.bodies_ended: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.train, name="trainer", daemon=True)

    def closure(self) -> Any:
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        time.sleep(STEP_S)
        self.bodies_ended.append(time.time())
        return loss

    def train(self) -> None:
        while not self.stop.is_set():
            self.started.append(time.time())
            self.optimizer.step(self.closure)

    def inside_a_step(self) -> float:
        """Wait until a step has run 0.05-0.15 s of its STEP_S; the time then."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(self.started) >= 2 and 0.05 < time.time() - self.started[-1] < 0.15:
                return time.time()
            time.sleep(0.005)
        raise AssertionError("the trainer did not step")


def census(tmp_path: Path, name: str) -> dict[str, Any]:
    path = tmp_path / name
    run_handler("torch tensors", {"path": str(path), "top": 5, "seconds": 30.0,
                                  "target": LBFGS_STEP, "timeout": 10.0}, timeout=60)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def global_post_hooks() -> int:
    return len(sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks)


def test_a_census_after_an_optimizers_step_ends_the_step_running_now(tmp_path: Path) -> None:
    hooks_before = global_post_hooks()
    trainer = Trainer()
    trainer.thread.start()
    docs, lags = [], []
    try:
        for n in range(3):
            asked = trainer.inside_a_step()
            doc = census(tmp_path, f"c{n}.json")
            began = doc["time"] - doc["elapsed_s"]
            ended = min(t for t in trainer.bodies_ended if t > asked)
            docs.append(doc)
            lags.append(began - ended)
    finally:
        trainer.stop.set()
        trainer.thread.join(30)
    # the step running when asked ended, then the census began: not a whole step later, as a
    # hook on the method's next call made it (that step's end: STEP_S after this one's)
    assert all(-0.01 < lag < STEP_S / 2 for lag in lags), lags
    assert {d["moment"] for d in docs} == {"right after torch.optim.lbfgs.LBFGS.step returned"}
    # AND nothing of ours is left: no code hook, no optimizer post-hook
    assert not hook_registry.active()
    assert global_post_hooks() == hooks_before


def test_a_census_after_a_step_no_optimizer_runs_yet_waits_for_the_method(tmp_path: Path) -> None:
    # No LBFGS built yet: torch has not wrapped its step with the step hooks; the method's own
    # hook takes the census after its next call (the fallback), and the timeout bounds it.
    start = time.monotonic()
    doc = run_handler("torch tensors", {"path": str(tmp_path / "c.json"), "top": 5, "seconds": 30.0,
                                        "target": spec("torch.optim.rprop", "step", "Rprop"),
                                        "timeout": 0.5}, timeout=60)[0]
    assert time.monotonic() - start < 10
    assert doc["moment"].startswith("at a safe point (torch.optim.rprop.Rprop.step did not return")
    assert not hook_registry.active()
