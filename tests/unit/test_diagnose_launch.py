"""Starting the bundled workloads (what `demo`, the smoke test and the benchmark rely on)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from flight_profiler.diagnose.launch import WorkloadFailed, start_workload
from flight_profiler.errors import UsageError
from support import PYTHONS, REPO, torch_available


def test_unknown_workload_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no workload named 'leaky'"):
        start_workload("leaky", str(tmp_path / "log"))


@pytest.mark.skipif(not torch_available(), reason="needs torch")
def test_ready_line_names_the_step_and_heartbeats_follow(tmp_path: Path) -> None:
    job = start_workload("leak_retained_graph", str(tmp_path / "log"), ["--heartbeat", "0.1"])
    try:
        target = job.wait_ready(90)
        assert target.words == "__main__ Trainer step"
        assert f"READY pid={job.pid} " in job.output()
        for _ in range(100):
            if len(job.heartbeats()) >= 2 or job.popen.poll() is not None:
                break
            time.sleep(0.1)
        assert len(job.heartbeats()) >= 2, job.output()
        step, ms = job.heartbeats()[-1]
        assert step > 0 and ms > 0
    finally:
        assert job.stop() is not None
    assert not os.path.exists(f"/proc/{job.pid}")


def test_a_python_without_torch_is_named_with_the_fix(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    no_torch = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
    others = [p for p in PYTHONS.values()
              if subprocess.run([p, "-c", no_torch], timeout=30).returncode == 0]
    if not others:
        pytest.skip("every interpreter here has torch")
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    job = start_workload("healthy", str(tmp_path / "log"), python=others[0])
    try:
        with pytest.raises(WorkloadFailed, match="torch is not installed for") as exc:
            job.wait_ready(30)
        assert "-m pip install torch" in exc.value.hint
    finally:
        job.stop()
