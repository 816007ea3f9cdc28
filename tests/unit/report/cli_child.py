"""`flight_profiler report` in a process of its own, as a user runs it, measured: exit code and
output, CPU seconds, peak RSS (VmHWM: ru_maxrss would keep the forked pytest's), under a 1 GB
address-space limit so that a runaway reader dies instead of swapping."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

_CHILD = """
import atexit, os, runpy, sys
def _rss():
    with open("/proc/self/status") as st:
        kb = next(line.split()[1] for line in st if line.startswith("VmHWM:"))
    with open(os.environ["FP_RSS_OUT"], "w") as fh:
        fh.write(kb)
atexit.register(_rss)
sys.argv = ["flight_profiler"] + sys.argv[1:]
runpy.run_module("flight_profiler", run_name="__main__", alter_sys=True)
"""


def report(tmp: Path, *args: str, env: dict[str, str] | None = None,
           timeout: float = 240.0) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """`flight_profiler report ARGS` in its own process under a 1 GB address-space limit:
    (the process, its CPU seconds, its peak RSS in MB)."""
    rss_file = tmp / f"rss-{time.monotonic_ns()}"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", _CHILD, "report", *args], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit, errors="replace",
                          env=dict(os.environ, FP_RSS_OUT=str(rss_file), FP_REPORT_JOBS="1", **(env or {})))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rss = float(rss_file.read_text()) / 1024 if rss_file.exists() else float("inf")
    return proc, cpu, rss


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a refused input (exit 8, nothing but it and its hint)."""
    from flight_profiler.errors import ExitCode

    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == ExitCode.BAD_INPUT_FILE, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and all(ln.startswith(("error:", "hint:")) for ln in lines), lines
    return errors[0]
