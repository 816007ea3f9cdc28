"""A target that dies while the agent holds its stderr keeps its last words for the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from flight_profiler.agent import protocol
from flight_profiler.attach import cleanup, last_words
from flight_profiler.attach.agent_dir import AgentDir

# The agent's side, as it runs in a target: its log in the private directory, then torch's
# profiler holding fd 2 (QuietStderr) when the process aborts.
DIES_WHILE_HELD = textwrap.dedent("""
    import os, sys
    from flight_profiler.agent import agent_log, protocol
    from flight_profiler.agent.torch_support import QuietStderr
    directory = protocol.socket_dir(os.geteuid())
    name = protocol.log_name(os.getpid())
    agent_log.LOG.open(os.path.join(directory, name))
    print(name, flush=True)
    os.write(2, b"before the hold\\n")
    quiet = QuietStderr(python_warnings=False)
    os.write(2, b"terminate called after throwing an instance of 'c10::Error'\\n")
    os.abort()
""")

RETURNS_AFTER_HOLD = textwrap.dedent("""
    import os
    from flight_profiler.agent import agent_log, protocol
    from flight_profiler.agent.torch_support import QuietStderr
    directory = protocol.socket_dir(os.geteuid())
    name = protocol.log_name(os.getpid())
    agent_log.LOG.open(os.path.join(directory, name))
    print(name, flush=True)
    quiet = QuietStderr(python_warnings=False)
    os.write(2, b"a line of the job's own\\n")
    quiet.close()
    print(sorted(n for n in os.listdir(directory) if n.startswith(name[:-4] + protocol.HELD_STDERR)))
""")


def _run(code: str) -> tuple[subprocess.CompletedProcess[str], int, last_words.Finder]:
    """Run ``code`` as a target; with the finder the CLI makes when it connects (before the
    request that the target dies in)."""
    with AgentDir.open(os.geteuid()):
        pass  # the private directory exists, as after any attach
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    find = last_words.finder(proc.pid, os.geteuid(), "/", protocol.log_name(proc.pid))
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid, find


def test_a_target_that_aborts_while_its_stderr_is_held_leaves_its_last_words() -> None:
    # GIVEN a target whose agent holds its stderr (torch's profiler running) when it aborts
    proc, _, find = _run(DIES_WHILE_HELD)
    assert proc.returncode < 0, proc.stderr  # SIGABRT
    log_name = proc.stdout.split()[0]
    # THEN its own stderr got what it wrote before the hold only
    assert "before the hold" in proc.stderr and "terminate called" not in proc.stderr
    # AND the CLI, whose connection was lost, finds the abort's message and where it is
    words = find()
    assert words is not None and "terminate called after throwing" in words, words
    assert protocol.socket_dir(os.geteuid()) in words
    # AND the next attach's sweep removes the dead process's file
    with AgentDir.open(os.geteuid()) as directory:
        removed = cleanup.sweep(directory)
    assert any(protocol.HELD_STDERR in name and name.startswith(log_name[:-4]) for name in removed)
    assert find() is None


def test_a_hold_that_ends_leaves_no_file_and_gives_the_job_its_lines_back() -> None:
    # GIVEN a hold that ends as usual
    proc, _, find = _run(RETURNS_AFTER_HOLD)
    # THEN the job's own line reached its stderr, and no held file is left behind
    assert proc.returncode == 0, proc.stderr
    assert "a line of the job's own" in proc.stderr
    assert proc.stdout.splitlines()[1] == "[]"
    # AND a finder for a live or cleanly gone target says nothing
    assert last_words.finder(os.getpid(), os.geteuid(), "/", "agent-1.log")() is None
    assert find() is None
