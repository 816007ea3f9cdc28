"""torch grads and torch anomaly against a real training process, through the CLI.

The target is written as users write it: the model and optimizer live in an object created
inside main(), the loop forgets optimizer.zero_grad(), and a second method runs long enough to
be interrupted mid-call. Its anomaly flags start at a NON-default state (off, check_nan off) so
that restoring proves both flags come back exactly; the loop prints them between calls, and the
slow method prints them inside its body (proving the command did turn anomaly mode on).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import Target, spawn, temp_dir, torch_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch_available(), reason="needs torch in the test interpreter's venv"),
]

CLI = [sys.executable, "-m", "flight_profiler"]
ENV = {**os.environ, "COLUMNS": "200"}  # holder paths are not folded across lines

TRAINER = """
import os, sys, time
import torch

stop_file = sys.argv[1]
torch.set_anomaly_enabled(False, False)


class Trainer:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.001)

    def step(self, i):
        x = torch.randn(16, 8)
        loss = (self.model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()          # no self.opt.zero_grad(): gradients accumulate
        self.opt.step()
        return loss.item()

    def slow(self, i):
        print(f"in {torch.is_anomaly_enabled()} {torch.is_anomaly_check_nan_enabled()}", flush=True)
        time.sleep(0.6)
        return torch.ones(2).sum().item()


def never_called():
    pass


def main():
    trainer = Trainer()
    print("READY", flush=True)
    i = 0
    while not os.path.exists(stop_file):
        trainer.step(i)
        trainer.slow(i)
        print(f"st {i} {torch.is_anomaly_enabled()} {torch.is_anomaly_check_nan_enabled()}", flush=True)
        i += 1
    print("DONE", flush=True)


main()
"""


class Job:
    def __init__(self, workdir: Path) -> None:
        self.stop_file = temp_dir("fp-stop-") / "stop"
        self.workdir = workdir
        self.target: Target = spawn(TRAINER, args=(str(self.stop_file),), timeout=60)
        self.pid = self.target.pid

    def cli(self, command: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, str(self.pid), *extra, "--cmd", command], cwd=self.workdir,
                              capture_output=True, text=True, timeout=timeout, env=ENV)

    def json(self, command: str) -> dict[str, Any]:
        proc = self.cli(command, "--json")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()][-1]

    def states(self) -> list[tuple[int, str]]:
        return [(int(n), s) for n, s in re.findall(r"^st (\d+) (\w+ \w+)$", self.target.stdout, re.M)]

    def state_after_now(self, steps: int = 2, timeout: float = 30) -> str:
        """The flags the loop prints between calls, ``steps`` iterations from now."""
        seen = self.states()
        start = seen[-1][0] if seen else -1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [s for n, s in self.states() if n >= start + steps]
            if later:
                return later[-1]
            assert self.target.alive(), self.target.stderr[-2000:]
            time.sleep(0.1)
        raise AssertionError("the target stopped training")

    def background(self, command: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*CLI, str(self.pid), "--cmd", command], cwd=self.workdir,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_inside(self, count_before: int, timeout: float = 60) -> None:
        """Until the slow method has run once with anomaly mode on (the command is active)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.target.stdout.count("in True False") > count_before:
                return
            time.sleep(0.05)
        raise AssertionError("anomaly mode never came on inside the call")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    j = Job(tmp_path_factory.mktemp("torch-health"))
    j.target.wait_for(r"st \d+", 60)
    yield j
    j.target.stop()


def test_grads_names_the_missing_zero_grad(job):
    result = job.json("torch grads __main__ Trainer step -n 3 -f g.json")
    (model,) = result["models"]
    assert model["name"] == "main() local trainer.model", model["name"]
    assert [m["models"][0]["grad_norm"] for m in result["measurements"]] == sorted(
        m["models"][0]["grad_norm"] for m in result["measurements"])
    (opt,) = result["optimizers"]
    assert opt["steps"] >= 3 and opt["zero_grad_calls"] == 0, opt

    from flight_profiler.report.engine import analyze

    report = analyze([str(job.workdir / "g.json")], jobs=1)
    acc = [f for f in report.findings if f.metrics.get("pattern") == "grads-accumulating"]
    assert acc and acc[0].severity == "critical" and "zero_grad() is never called" in acc[0].root_cause
    human = job.cli("torch grads -f g2.json")
    # Holders are named from the outermost frame: main()'s trainer, wherever the thread is.
    assert human.returncode == 0, human.stderr
    assert "main() local trainer.model" in human.stdout, human.stdout
    assert job.state_after_now() == "False False"


def test_anomaly_restores_flags_after_n_calls_and_timeout(job):
    inside = job.target.stdout.count("in True False")
    result = job.json("torch anomaly __main__ Trainer slow -n 2")
    assert result["calls_recorded"] == 2 and result["found"] is False
    assert result["anomaly_before"] == result["anomaly_after"] == {"enabled": False, "check_nan": False}
    assert job.target.stdout.count("in True False") == inside + 2  # it was on inside the calls only
    assert job.state_after_now() == "False False"

    proc = job.cli("torch anomaly __main__ never_called --timeout 1")
    assert proc.returncode != 0 and "no call" in proc.stderr, proc.stderr
    assert job.state_after_now() == "False False"


def test_anomaly_restores_flags_on_ctrl_c_mid_call(job):
    inside = job.target.stdout.count("in True False")
    cli = job.background("torch anomaly __main__ Trainer slow -n 50 --timeout 120")
    job.wait_inside(inside)
    cli.send_signal(signal.SIGINT)  # while a call is in flight (0.6 s each, most of the loop)
    cli.wait(60)
    assert job.state_after_now() == "False False"
    status = job.json("status")
    assert not any("anomaly" in h for h in status.get("hooks", [])), status


def test_anomaly_restores_flags_when_the_client_vanishes(job):
    inside = job.target.stdout.count("in True False")
    cli = job.background("torch anomaly __main__ Trainer slow -n 50 --timeout 120")
    job.wait_inside(inside)
    cli.kill()  # SIGKILL: no cancel message, the connection just drops
    cli.wait(30)
    assert job.state_after_now() == "False False"
    # The agent took the drop as a cancel: a new anomaly request may start (nothing left busy).
    result = job.json("torch anomaly __main__ Trainer slow -n 1")
    assert result["anomaly_before"] == result["anomaly_after"] == {"enabled": False, "check_nan": False}


def test_anomaly_restores_flags_on_detach(job):
    inside = job.target.stdout.count("in True False")
    cli = job.background("torch anomaly __main__ Trainer slow -n 50 --timeout 120")
    job.wait_inside(inside)
    detach = job.cli("detach")
    assert detach.returncode == 0, detach.stderr
    cli.wait(60)
    assert job.state_after_now() == "False False"
    job.stop_file.touch()
    assert job.target.popen.wait(30) == 0
    assert "DONE" in job.target.stdout and "Traceback" not in job.target.stderr
