"""The first command to a process without an agent, on the click-free path (cli/fast_cmd.py,
issue 23): it injects as `flight_profiler attach PID --cmd ...` does, answers the same, and the
target keeps running; a second command reuses the agent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from support import spawn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# State in a function's locals and work in a thread, as a user's job has it.
TARGET = """
import threading, time

def work():
    beats = 0
    while True:
        beats += 1
        print(f"hb {beats}", flush=True)
        time.sleep(0.05)

threading.Thread(target=work, name="worker", daemon=True).start()
print("READY", flush=True)
while True:
    time.sleep(0.2)
"""


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The CLI's run, its stderr without -X importtime's lines, and the modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "flight_profiler", *args],
                          capture_output=True, text=True, timeout=60)
    lines = done.stderr.splitlines(keepends=True)
    modules = {ln.rsplit("|", 1)[-1].strip() for ln in lines if ln.startswith("import time:")}
    done.stderr = "".join(ln for ln in lines if not ln.startswith("import time:"))
    return done, modules


def test_the_first_command_injects_on_both_paths_alike() -> None:
    fast_target, click_target = spawn(TARGET), spawn(TARGET)
    try:
        fast, fast_modules = run_cli(str(fast_target.pid), "--cmd", "stack", "--json")
        slow, slow_modules = run_cli("attach", str(click_target.pid), "--cmd", "stack", "--json")
        # the two paths indeed: the first imported neither click nor the command grammar
        assert "click" in slow_modules and "flight_profiler.attach.inject" in slow_modules
        assert "flight_profiler.attach.inject" in fast_modules
        assert {"click", "flight_profiler.requests.grammar"}.isdisjoint(fast_modules)
        assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr) == (0, "")
        for done, target in ((fast, fast_target), (slow, click_target)):
            names = {t["name"] for t in json.loads(done.stdout)["threads"]}
            assert {"MainThread", "worker"} <= names
            assert target.alive()
        # the agent the fast path injected serves the next command, on the fast path too
        again, again_modules = run_cli(str(fast_target.pid), "--cmd", "status", "--json")
        assert "flight_profiler.attach.inject" not in again_modules
        assert again.returncode == 0 and json.loads(again.stdout)["pid"] == fast_target.pid
        beats = fast_target.stdout.count("hb ")
        fast_target.wait_for(rf"hb {beats + 2}\b")  # still running its own work
    finally:
        fast_target.stop()
        click_target.stop()


# A bare job (nothing imported but what it uses) that cannot write bytecode, as a job of another
# user cannot write the __pycache__ of root's staged copy. SIGUSR1: it prints its modules and
# the files its interpreter compiled from source.
BARE = """
import json, signal, sys, time
from importlib.machinery import SourceFileLoader

compiled = []
_source_to_code = SourceFileLoader.source_to_code

def source_to_code(self, data, path, *args, **kwargs):
    compiled.append(str(path))
    return _source_to_code(self, data, path, *args, **kwargs)

SourceFileLoader.source_to_code = source_to_code

def report(*_):
    print("MODULES " + json.dumps({"modules": sorted(sys.modules), "compiled": compiled}), flush=True)

signal.signal(signal.SIGUSR1, report)
print("READY", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_first_command_imports_little_in_the_cli_and_in_the_target() -> None:
    """Issue 23: what a first command costs is mostly imports, on both sides. The CLI's way to an
    injection imports neither dataclasses, typing, secrets nor gdb's and pyrasite's modules; the
    agent starts and answers `status` in a bare target without typing, logging or the torch
    commands' helpers, and loads its modules from the bytecode staged beside them (the target
    compiles none of them)."""
    target = spawn(BARE, env={"PYTHONDONTWRITEBYTECODE": "1"})
    try:
        done, modules = run_cli(str(target.pid), "--cmd", "status", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["pid"] == target.pid
        assert "flight_profiler.attach.ptrace_inject" in modules  # it did inject
        assert sorted(modules & {"dataclasses", "inspect", "typing", "secrets", "shutil", "logging",
                                 "flight_profiler.attach.gdb", "flight_profiler.attach.pyrasite"}) == []
        target.popen.send_signal(signal.SIGUSR1)
        seen = json.loads(target.wait_for(r"MODULES (.*)").group(1))
        assert "_flight_profiler_agent.server" in seen["modules"]
        assert sorted(set(seen["modules"]) & {
            "typing", "logging", "traceback", "tempfile", "pickle", "gzip",
            "_flight_profiler_agent.torch_support"}) == []
        assert [path for path in seen["compiled"] if "/pkg/" in path] == []
        assert target.alive()
    finally:
        target.stop()
