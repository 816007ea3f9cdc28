"""`flight_profiler diagnose` on training-health workloads written as users write them (state in
an object created inside main()): a loop that never calls zero_grad() (fed by a DataLoader with
worker processes, re-forked every epoch while the hooks are in), an inference service with
autograd on, a streaming LSTM that never detaches its state. Each must be diagnosed right and
keep running, unharmed, until told to stop; then exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import spawn, torch_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch_available(), reason="the workloads need torch"),
]

CLI = [sys.executable, "-m", "flight_profiler"]
WORKLOADS = Path(__file__).resolve().parent / "training_workloads"


def diagnose(tmp_path: Path, script: str, method: list[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    stop = tmp_path / "stop"
    target = spawn((WORKLOADS / script).read_text(), args=(str(stop),), timeout=60)
    out = tmp_path / "diag"
    try:
        target.wait_for(r"hb \d+", 60)
        proc = subprocess.run([*CLI, "diagnose", str(target.pid), *method, "--out", str(out), "--calls", "3",
                               "--duration", "3", "--timeout", "30", "--json"],
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert target.alive(), target.stderr[-2000:]
        before = target.stdout.count("hb ")
        target.wait_for(r"hb \d+", 30, start=len(target.stdout))  # still running after the diagnosis
        assert target.stdout.count("hb ") > before
        stop.touch()
        assert target.popen.wait(30) == 0, target.stderr[-2000:]
        assert "DONE" in target.stdout and "Traceback" not in target.stderr
    finally:
        target.stop()
    report = json.loads((out / "report.json").read_text())
    return report, json.loads(proc.stdout), target.stderr


def findings(report: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["rule"] == rule]


def test_loop_without_zero_grad_names_the_root_cause(tmp_path):
    report, result, _ = diagnose(tmp_path, "no_zero_grad.py", ["__main__", "Trainer", "step"])
    health = findings(report, "grad-health")
    acc = [f for f in health if f["metrics"]["pattern"] == "grads-accumulating"]
    assert acc and acc[0]["severity"] == "critical", [f["title"] for f in report["findings"]]
    assert "zero_grad() is never called" in acc[0]["root_cause"]
    assert acc[0]["metrics"]["model"] == "main() local trainer.model"
    # Whether the loss is NaN yet depends on how many steps ran before the grads phase (the
    # earlier phases slow the loop down); if it is, the accumulation is named as the cause.
    nonfinite = [f for f in health if f["metrics"]["pattern"] == "non-finite"]
    grads = next(p for p in result["phases"] if p["name"] == "grads")
    assert grads["status"] == "ok"
    if nonfinite:
        assert "accumulated" in nonfinite[0]["root_cause"]
        assert "torch anomaly __main__ Trainer step -n 1" in grads["command"]
    assert report["findings"][0]["rule"] == "grad-health"


def test_inference_service_with_grad_on(tmp_path):
    report, _, _ = diagnose(tmp_path, "eval_service.py", ["__main__", "Service", "predict"])
    (f,) = findings(report, "eval-with-grad")
    assert "inference_mode" in f["fix"][0] and f["metrics"]["forward_ops_recording"] >= 20
    # The live calls confirm it, with the memory each one keeps for a backward that never comes.
    (measured,) = f["metrics"]["measured"]
    assert measured["target"] == "__main__.Service.predict" and min(measured["saved_bytes"]) >= 64 * 512 * 4
    assert not findings(report, "grad-health")  # no training here: nothing to say about grads


def test_streaming_lstm_graph_chain_says_detach(tmp_path):
    report, _, _ = diagnose(tmp_path, "streaming_lstm.py", ["__main__", "Stream", "chunk"])
    chain = findings(report, "graph-chain")
    assert chain, [f["title"] for f in report["findings"]]
    # Named from the method's calls (the census may not reach main()'s locals on every branch).
    holders = [f["metrics"]["holder"] for f in chain]
    assert "__main__.Stream.chunk: self.state[0]" in holders, holders
    assert all(".detach()" in f["title"] for f in chain)
    assert chain[0]["severity"] == "critical"
