"""The CLI as the arm tests drive it: a command to a live pid, its --json answer, and the
evidence directories a trigger wrote (tests/integration/test_arm_jobs.py, test_arm_slow.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "flight_profiler"]
ENV = {**os.environ, "COLUMNS": "200"}


def cli(pid: int, command: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, str(pid), *extra, "--cmd", command], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def cli_json(pid: int, command: str) -> dict[str, Any]:
    proc = cli(pid, command, "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc: dict[str, Any] = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()][-1]
    return doc


def events(out: Path, timeout: float) -> list[Path]:
    """The event directories in ``out`` (never the hidden ones still being written), waiting up
    to ``timeout`` seconds for the first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(p for p in out.iterdir() if not p.name.startswith(".")) if out.exists() else []
        if found:
            return found
        time.sleep(0.2)
    return []
