"""agent_log: a regular file of ours or nowhere; bounded; never a word on stderr."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path

import pytest

from flight_profiler.agent import agent_log


@pytest.fixture
def log() -> logging.Logger:
    logger = logging.getLogger(f"fp_test_log_{id(object())}")
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def test_lines_go_to_the_file_and_rotate_once(tmp_path: Path, log: logging.Logger,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_log, "MAX_BYTES", 2000)
    path = tmp_path / "agent.log"
    agent_log.setup(log, str(path))
    for i in range(100):
        log.info("line %d %s", i, "x" * 40)
    assert "line 99" in path.read_text()
    assert (tmp_path / "agent.log.1").exists()
    assert path.stat().st_size <= 2000 and oct(path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_anything_but_a_regular_file_means_no_log_and_no_stderr(
        tmp_path: Path, log: logging.Logger, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
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
    agent_log.setup(log, str(path))
    log.error("nowhere to go")
    log.warning("nor this")
    assert [type(h) for h in log.handlers] == [logging.NullHandler]
    assert stderr.getvalue() == ""
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_text() == ""


def test_a_write_that_fails_says_nothing(tmp_path: Path, log: logging.Logger,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    agent_log.setup(log, str(tmp_path / "agent.log"))
    handler = log.handlers[0]
    assert isinstance(handler, agent_log.AgentLogHandler)
    assert handler.fd is not None
    os.close(handler.fd)  # the disk went away, say
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    log.error("lost")
    assert stderr.getvalue() == ""
    handler.fd = None
