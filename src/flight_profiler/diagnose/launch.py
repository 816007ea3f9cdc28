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
                tail = "\n".join(self.output().strip().splitlines()[-5:])
                hint = ("the demo runs the workload with this Python "
                        f"({sys.executable}); install torch in it (pip install torch)"
                        if "No module named 'torch'" in tail else f"see {self.log_path}")
                raise WorkloadFailed(f"workload {self.name} exited with code "
                                     f"{self.popen.returncode} before it was ready: {tail}", hint)
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
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(
            [python or sys.executable, "-m", f"flight_profiler.workloads.{name}", *(args or [])],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
    return Workload(name, popen, log_path)
