"""The session-start check of tests/conftest.py: without ptrace the run stops at once, with the
fix, instead of failing every attaching test on its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _PTRACE_PROBE, ptrace_refusal
from support import REPO

ATTACHING_TEST = "tests/integration/test_attach.py::test_ctrl_c_during_a_stream_removes_every_hook"


def _run(tmp_path: Path, refusal: str | None, *options: str) -> subprocess.CompletedProcess[str]:
    # A plugin loaded before the run stands in for the kernel's answer.
    plugin = tmp_path / "fake_ptrace.py"
    plugin.write_text(
        "import sys\nimport pytest\n\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(session, config, items):\n"
        f"    sys.modules['conftest'].ptrace_refusal = lambda: {refusal!r}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fake_ptrace", "-p", "no:cacheprovider",
         "-q", *options, ATTACHING_TEST],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_without_ptrace_the_run_stops_once_with_the_fix(tmp_path: Path) -> None:
    # GIVEN a machine whose kernel refuses ptrace, WHEN a run includes an attaching test
    proc = _run(tmp_path, "Operation not permitted")
    # THEN pytest stops before any test, printing the cause and the fix once
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert out.count("ptrace is refused on this machine (Operation not permitted)") == 1, out
    assert "Fix: " in out and "run as the target's user or as root" in out
    assert "passed" not in out and "failed" not in out  # no test ran


def test_with_ptrace_the_run_goes_on(tmp_path: Path) -> None:
    proc = _run(tmp_path, None, "--collect-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_ctrl_c_during_a_stream_removes_every_hook" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to probe as another user")
def test_the_probe_reports_a_refusal_from_the_kernel() -> None:
    # GIVEN a process of root's, probed by an unprivileged uid: the kernel says no
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        probe = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                                sys.executable, "-I", "-c", _PTRACE_PROBE, str(sleeper.pid)],
                               capture_output=True, text=True, timeout=30)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert probe.returncode == 1
    assert probe.stdout.strip() == os.strerror(1)  # EPERM
    # and on this machine, where the integration tests do attach, the real probe passes
    assert ptrace_refusal() is None
