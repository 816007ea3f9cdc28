"""agent_log: a regular file of ours or nowhere; bounded; never a word on stderr; logging only
when something may log through it (issue 23: ~10 ms of the first command in a bare target)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flight_profiler.agent import agent_log, log_bridge


@pytest.fixture
def log() -> Iterator[agent_log.AgentLog]:
    out = agent_log.AgentLog()
    yield out
    out.close()


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    named = logging.getLogger(f"fp_test_log_{id(object())}")
    yield named
    for handler in list(named.handlers):
        named.removeHandler(handler)
        handler.close()


def test_lines_go_to_the_file_and_rotate_once(tmp_path: Path, log: agent_log.AgentLog,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_log, "MAX_BYTES", 2000)
    path = tmp_path / "agent.log"
    log.open(str(path))
    for i in range(100):
        log.info("line %d %s", i, "x" * 40)
    assert "line 99" in path.read_text()
    assert (tmp_path / "agent.log.1").exists()
    assert path.stat().st_size <= 2000 and oct(path.stat().st_mode & 0o777) == "0o600"


def test_lines_read_as_the_logging_formatter_wrote_them(tmp_path: Path, log: agent_log.AgentLog,
                                                        logger: logging.Logger) -> None:
    """The agent's own lines and those logging sends through the bridge look alike: one
    format in one file, whichever wrote it."""
    path = tmp_path / "agent.log"
    log.open(str(path))
    log.info("agent %s listening on %s", "0.1.0", "/x.sock")
    log_bridge.bind(log, logger)
    logger.info("agent %s listening on %s", "0.1.0", "/x.sock")
    ours, theirs = path.read_text().splitlines()
    # the same up to the milliseconds: "YYYY-mm-dd HH:MM:SS,mmm PID INFO message"
    assert ours.split(" ", 2)[2] == theirs.split(" ", 2)[2] == \
        f"{os.getpid()} INFO agent 0.1.0 listening on /x.sock"
    assert ours[:19] == theirs[:19] or ours[:16] == theirs[:16]
    assert ours[19] == theirs[19] == "," and ours[20:23].isdigit()


def test_exception_lines_carry_the_traceback(tmp_path: Path, log: agent_log.AgentLog) -> None:
    path = tmp_path / "agent.log"
    log.open(str(path))
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("command %r failed", "status")
    text = path.read_text()
    assert " ERROR command 'status' failed\nTraceback (most recent call last):" in text
    assert text.rstrip().endswith("ValueError: boom")


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_anything_but_a_regular_file_means_no_log_and_no_stderr(
        tmp_path: Path, log: agent_log.AgentLog, logger: logging.Logger, kind: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent.log"
    if kind == "fifo":
        os.mkfifo(path)  # no reader: a plain open() for writing would block for ever
    elif kind == "directory":
        path.mkdir()
    else:
        (tmp_path / "elsewhere").write_text("")
        path.symlink_to(tmp_path / "elsewhere")
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    log.open(str(path))
    assert log.fd is None
    log.error("nowhere to go")
    log_bridge.bind(log, logger)
    logger.error("nowhere to go")
    logger.warning("nor this")
    assert [type(h) for h in logger.handlers] == [log_bridge.AgentLogHandler]
    assert not logger.propagate
    assert stderr.getvalue() == ""
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_text() == ""


def test_a_write_that_fails_says_nothing(tmp_path: Path, log: agent_log.AgentLog,
                                         logger: logging.Logger,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    log.open(str(tmp_path / "agent.log"))
    assert log.fd is not None
    os.close(log.fd)  # the disk went away, say
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    log.error("lost")
    log_bridge.bind(log, logger)
    logger.error("lost")
    assert stderr.getvalue() == ""
    log.fd = None


_FRESH = """
import sys
from flight_profiler.agent import agent_log, registry
agent_log.setup(sys.argv[1])
for cmd in sys.argv[2:]:
    registry.lookup(cmd)
print("logging" in sys.modules)
"""


@pytest.mark.parametrize(("commands", "imported"), [
    ((), False), (("status", "stack"), False), (("watch",), True), (("arm",), True)])
def test_logging_is_imported_only_for_a_command_that_may_use_it(
        tmp_path: Path, commands: tuple[str, ...], imported: bool) -> None:
    """In a fresh interpreter without logging: starting the log and loading status or stack
    leave it out; loading any other command brings it in, bound before the triggers (whose
    lines would otherwise find no handler and go to the target's stderr)."""
    done = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "agent.log"), *commands],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(imported)
    assert done.stderr == ""


def test_triggers_lines_reach_the_agent_log_not_stderr(tmp_path: Path) -> None:
    """A trigger module logs through logging.getLogger("flight_profiler.agent"): once the
    registry loaded `arm`, its warnings land in the file and nothing reaches stderr."""
    code = ("import sys, logging\n"
            "from flight_profiler.agent import agent_log, registry\n"
            "agent_log.setup(sys.argv[1])\n"
            "registry.lookup('arm')\n"
            "logging.getLogger('flight_profiler.agent').warning('trigger said %s', 'hi')\n")
    path = tmp_path / "agent.log"
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          check=True)
    assert done.stderr == ""
    assert path.read_text().rstrip().endswith(" WARNING trigger said hi")
