"""Start a bundled sample workload as a child process and wait until it is ready to diagnose.

Used by ``flight_profiler demo``, the smoke test and the benchmark. The workload writes to a log
file, never a pipe (a full pipe would block it), and is started in its own session so that a
Ctrl-C meant for the CLI does not also kill it mid-step; :meth:`Workload.stop` ends it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from flight_profiler.diagnose.model import MethodTarget
from flight_profiler.errors import FlightProfilerError, UsageError
from flight_profiler.workloads import WORKLOADS

_READY = re.compile(r"^READY pid=(\d+) step_fn=(.+)$", re.M)
_BEAT = re.compile(r"^step (\d+) avg_ms=([0-9.]+)$", re.M)


class WorkloadFailed(FlightProfilerError):
    kind = "workload_failed"


@dataclass
class Workload:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: str
    python: str = sys.executable
    target: MethodTarget | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""

    def heartbeats(self) -> list[tuple[int, float]]:
        """(step, mean step ms since the previous heartbeat) for each heartbeat line so far."""
        return [(int(m.group(1)), float(m.group(2))) for m in _BEAT.finditer(self.output())]

    def wait_ready(self, timeout: float) -> MethodTarget:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = _READY.search(self.output())
            if m:
                self.target = MethodTarget.parse(m.group(2).split())
                return self.target
            if self.popen.poll() is not None:
                lines = self.output().strip().splitlines()
                last = lines[-1] if lines else "no output"
                if "No module named 'torch'" in last:
                    raise WorkloadFailed(
                        f"workload {self.name} cannot start: torch is not installed for "
                        f"{self.python}",
                        f"install PyTorch in that environment (`{self.python} -m pip install "
                        "torch`, the CPU build is enough), then retry")
                raise WorkloadFailed(f"workload {self.name} exited with code "
                                     f"{self.popen.returncode} before it was ready: {last}",
                                     f"its full output is in {self.log_path}")
            time.sleep(0.05)
        raise WorkloadFailed(f"workload {self.name} was not ready within {timeout:g}s",
                             f"see {self.log_path}")

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return self.popen.returncode


def start_workload(name: str, log_path: str, args: list[str] | None = None,
                   python: str | None = None) -> Workload:
    if name not in WORKLOADS:
        raise UsageError(f"no workload named {name!r}", f"one of: {', '.join(WORKLOADS)}")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    python = python or sys.executable
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(
            [python, "-m", f"flight_profiler.workloads.{name}", *(args or [])],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
    return Workload(name, popen, log_path, python)
