"""`diagnose` on workloads written the way users write them (tests/integration/user_workloads):
state in main()'s locals, torch work in a worker thread while the main thread waits in join(),
a DataLoader with workers too slow for the step, and a healthy loop that must stay quiet.

Each runs a real target, the real agent and the real report; kept short (5 calls, 3 s between
censuses) for a 2-core machine. Attaching needs a working gdb on PATH (or the ptrace injector).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import spawn, torch_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_available(), reason="the workloads need torch"),
]

WORKLOADS = Path(__file__).resolve().parent / "user_workloads"
CLI = [sys.executable, "-m", "flight_profiler"]
SEVERE = ("warning", "critical")


def diagnose(tmp_path: Path, name: str, target: list[str]) -> dict[str, Any]:
    job = spawn((WORKLOADS / f"{name}.py").read_text(), ready="READY", timeout=90, args=("300",))
    try:
        proc = subprocess.run(
            [*CLI, "diagnose", str(job.pid), *target, "--out", str(tmp_path / "diag"),
             "--calls", "5", "--duration", "3", "--timeout", "30", "--json"],
            capture_output=True, text=True, timeout=240)
        assert job.alive(), job.stderr[-2000:]  # the job survived its diagnosis
    finally:
        job.stop()
    assert proc.returncode in (0, 9), proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    failed = [(p["name"], p["reason"]) for p in result["phases"] if p["status"] in ("failed", "timed_out")]
    assert not failed, failed
    return result


def findings(result: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [f for f in result["findings"] if f["rule"] == rule]


def test_trainer_created_in_main_is_named_by_its_local(tmp_path: Path) -> None:
    result = diagnose(tmp_path, "trainer_in_main", ["__main__", "Trainer", "step"])
    (g,) = findings(result, "graph-retention")
    assert g["metrics"]["holder"] == "main() local trainer.history[*]"
    assert "<unreached>" not in json.dumps(g)
    assert "loss.item()" in g["fix"][0]


def test_inference_server_parked_in_join_gets_graph_retention_and_the_no_grad_fix(
        tmp_path: Path) -> None:
    # The main thread waits in join(); a worker thread serves: every tensor read still works
    result = diagnose(tmp_path, "inference_server", ["__main__", "handle"])
    assert result["seconds"] < 60
    (g,) = findings(result, "graph-retention")
    assert g["metrics"]["holder"] == "__main__._RESULT_CACHE[*]"
    assert "torch.inference_mode()" in g["fix"][0]
    for leak in findings(result, "memory-leak"):
        assert not [w for w in leak["where"] if "req-" in w.split(" (")[0]]  # per container


def test_slow_dataloader_with_a_method_is_found_with_the_real_settings(tmp_path: Path) -> None:
    result = diagnose(tmp_path, "slow_loader", ["__main__", "train_step"])
    (d,) = findings(result, "dataloader-bottleneck")
    assert d["severity"] in SEVERE and "main() target_main.py:" in d["where"][0]
    assert "`num_workers=2`" in d["fix"][0]


@pytest.mark.parametrize("run", range(5))
def test_healthy_loop_stays_quiet(tmp_path: Path, run: int) -> None:
    result = diagnose(tmp_path, "healthy_loop", ["__main__", "train_step"])
    assert [f["rule"] for f in result["findings"] if f["severity"] in SEVERE] == []


TWO_TRAINERS = """
import threading, time, torch
torch.set_num_threads(1)

def train(name, stop):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    while not stop.is_set():
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(loss)          # grad_fn tensors: the census reads t.grad_fn of each
        if len(kept) > 400:
            del kept[:200]
        if len(kept) == 50:
            warm.release()

stop = threading.Event()
warm = threading.Semaphore(0)
workers = [threading.Thread(target=train, args=(f"w{i}", stop), name=f"trainer-{i}") for i in range(2)]
for w in workers:
    w.start()
warm.acquire()
warm.acquire()
print("READY", flush=True)
workers[0].join(300)               # the main thread is parked: the torch work is elsewhere
"""


def test_tensor_walks_never_race_torch_work_in_worker_threads(tmp_path: Path) -> None:
    """The walks that once crashed a training loop (SIGSEGV reading t.grad_fn during an op), now
    with the torch work in two worker threads and the main thread in join(): every walk works,
    names the workers' locals, and the target lives on."""
    from flight_profiler.api import connect

    job = spawn(TWO_TRAINERS, ready="READY", timeout=90)
    try:
        with connect(job.pid, timeout=30) as session:
            for _ in range(8):
                census = session.run(f"torch tensors --top 200 -f {tmp_path / 'c.json'}")
                paths = [h["path"] for h in census["holders"]]
                assert any(p.startswith("thread 'trainer-") and "local kept[*]" in p for p in paths), paths
                session.run("torch memory")
                assert job.alive(), job.stderr[-2000:]
            session.detach()
        time.sleep(0.5)
        assert job.alive(), job.stderr[-2000:]
    finally:
        job.stop()


@pytest.mark.parametrize("method", [["__main__", "MLP", "forward"],
                                    ["torch.optim.adam", "Adam", "step"]],
                         ids=["forward", "step"])
def test_validation_without_no_grad_is_found_with_forward_or_step_named(
        tmp_path: Path, method: list[str]) -> None:
    # The profile holds a few steps; the validation pass (once an epoch) is seen live: the
    # model's forward calls build graphs that no backward reads, between calls whose graphs are
    # read. With the step named, the model's forward is what is followed (a step saves nothing).
    result = diagnose(tmp_path, "validate_with_grad", method)
    (e,) = findings(result, "eval-with-grad")
    assert e["severity"] == "warning" and "no_grad" in " ".join(e["fix"])
    assert any(w.startswith("validate at target_main.py:") for w in e["where"]), e["where"]
    assert not [f for f in result["findings"] if f["severity"] in SEVERE and f["rule"] in
                ("memory-leak", "graph-retention", "idle-loop")]
