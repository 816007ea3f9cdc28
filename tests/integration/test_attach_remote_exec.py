"""Attaching by PEP 768's ``sys.remote_exec`` from a CLI that runs on CPython 3.14, for real.

Needs a flight_profiler installed under CPython 3.14: FLIGHT_PROFILER_CLI_314 names its
executable (.ci/run builds one with ../shared/tools/python314.sh); without it these tests skip.
The ptrace route into 3.14 targets from this CLI is covered by the tests parametrized over every
interpreter (tests/support.py finds ``python3.14`` on PATH).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from attach_targets import STATES, TARGET, finish

from support import spawn, temp_dir

CLI_314 = os.environ.get("FLIGHT_PROFILER_CLI_314", "")

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(180),
    pytest.mark.skipif(not (CLI_314 and os.access(CLI_314, os.X_OK)),
                       reason="set FLIGHT_PROFILER_CLI_314 to a flight_profiler installed under "
                              "CPython 3.14 (.ci/run builds one with ../shared/tools/python314.sh)"),
]


def python_of(cli: str) -> str:
    """The interpreter of a console script (its venv's python, which runs it)."""
    return str(Path(cli).parent / "python")


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI_314, *args], capture_output=True, text=True, timeout=timeout)


def _start(state: str):
    stop = temp_dir("fp-stop-") / "stop"
    return spawn(TARGET, python=python_of(CLI_314), args=(state, str(stop))), stop


@pytest.mark.parametrize("state", ["sleeping", "busy", "asyncio", "malloc"])
def test_a_314_cli_attaches_by_remote_exec_and_leaves_the_target_as_it_was(state: str) -> None:
    t, stop = _start(state)
    try:
        proc = run_cli(str(t.pid), "--method", "remote_exec", "--cmd", "stack", "--json",
                       "--timeout", "30", "-v")
        assert proc.returncode == 0, proc.stderr
        assert "injection method: remote_exec" in proc.stderr
        names = {f["function"].rsplit(".", 1)[-1] for th in json.loads(proc.stdout)["threads"]
                 for f in th["frames"]}
        assert STATES[state] in names
        # the agent serves what the ptrace route's agent serves: a watch of the target's code
        watch = run_cli(str(t.pid), "--cmd", "watch __main__ beat -n 2 --timeout 20")
        assert watch.returncode == 0, watch.stderr
        assert "2 matched, 2 shown; hooks removed" in watch.stdout, watch.stdout
        assert re.search(r"^\S+ #2 ", watch.stdout, re.M), watch.stdout
        detach = run_cli(str(t.pid), "--cmd", "detach")
        assert detach.returncode == 0 and "0 hook(s) left" not in detach.stderr, detach.stderr
        finish(t, stop)
    finally:
        stop.touch()
        t.stop()


def test_a_target_that_never_runs_python_is_left_untouched() -> None:
    # Blocked in accept() forever: the queued script cannot run; the CLI gives up in its time
    # with one line saying so, and the queued bootstrap does nothing when it finally runs.
    t, stop = _start("accept")
    try:
        started = time.monotonic()
        proc = run_cli(str(t.pid), "--method", "remote_exec", "--cmd", "stack", "--timeout", "5")
        assert proc.returncode == 7, proc.stderr
        assert time.monotonic() - started < 30
        assert "left as it was" in proc.stderr
        finish(t, stop)  # the stop file wakes it: it runs the queued script, then exits 0
    finally:
        stop.touch()
        t.stop()
