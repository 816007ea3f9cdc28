"""Start and stop torchrun jobs (gloo, CPU) for the whole-job tests and benches.

A job is ``python -m torch.distributed.run --standalone`` running a workload that writes
``READY_DIR/rank<N>`` (its pid) once its loop runs; the launcher gets its own session so that
the whole job (launcher, ranks, their DataLoader workers) is stopped by one signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

WORKLOADS = Path(__file__).resolve().parent / "integration" / "job_workloads"
DDP_TRAINER = WORKLOADS / "ddp_trainer.py"


class Job:
    def __init__(self, workload: Path, mode: str, n: int, directory: Path,
                 env: dict[str, str] | None = None, python: str = sys.executable) -> None:
        self.n = n
        self.ready = directory / f"ready-{mode}"
        self.ready.mkdir(parents=True)
        self.log = directory / f"{mode}.log"
        with open(self.log, "wb") as out:  # the child keeps its own copy of the descriptor
            self.popen = subprocess.Popen(
                self.command(python, workload, mode),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **(env or {})})
        self.launcher = self.popen.pid
        self.pids: dict[int, int] = {}

    def command(self, python: str, workload: Path, mode: str) -> list[str]:
        return [python, "-m", "torch.distributed.run", "--nproc-per-node", str(self.n),
                "--standalone", str(workload), mode, str(self.ready)]

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 180.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = list(self.ready.glob("rank*"))
            if len(files) == self.n and all(f.read_text() for f in files):
                self.pids = {int(f.name[4:]): int(f.read_text()) for f in files}
                return self.pids
            if self.popen.poll() is not None:
                raise AssertionError("the job ended before it was ready: " + self.log_tail())
            time.sleep(0.2)
        raise AssertionError("the ranks did not start: " + self.log_tail())

    def dead_ranks(self) -> list[int]:
        """Ranks whose process is gone (or a zombie)."""
        out = []
        for rank, pid in sorted(self.pids.items()):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                out.append(rank)
                continue
            if state in ("Z", "X"):
                out.append(rank)
        return out

    def stop(self) -> None:
        """SIGTERM to the launcher, which stops its ranks; past 20 s, SIGKILL to the launcher and
        to every rank's own group: torchrun starts each rank in a session of its own, so a
        killed launcher's ranks would run on as orphans."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
                kill_ranks(self.pids.values())


def kill_ranks(pids: Iterable[int]) -> None:
    """SIGKILL each rank's process group (the rank and its DataLoader workers) still there."""
    for pid in list(pids):
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
