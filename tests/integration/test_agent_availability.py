"""The agent stays reachable and silent, whatever its connections or its log file do.

Real targets, the real agent: a thread that cannot be started (what an address-space squeeze
does) no longer ends the accept loop for good; a flood of idle connections no longer costs a
thread each; a handshake trickled a byte at a time ends at its deadline; a log name that is a
FIFO or a directory neither hangs the agent nor writes into the target's stderr.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flight_profiler.agent import protocol
from flight_profiler.agent.server import MAX_CONNECTIONS
from flight_profiler.api import connect
from flight_profiler.errors import AttachFailed, RemoteCommandError
from support import PYTHONS, Target, spawn, temp_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PYTHON = PYTHONS.get("3.11") or next(iter(PYTHONS.values()))

SQUEEZABLE = r'''
import os, sys, threading, time

CTL = sys.argv[1]
real_start = threading.Thread.start
squeezed = [False]


def start(self):
    # what RLIMIT_AS or a thread limit does to every thread start in the process
    if squeezed[0]:
        raise RuntimeError("can't start new thread")
    return real_start(self)


threading.Thread.start = start
print("READY", flush=True)
seen = ""
while True:
    try:
        with open(CTL) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if text != seen:
        seen = text
        squeezed[0] = text == "squeeze"
        print("NOW " + (text or "free"), flush=True)
    time.sleep(0.01)
'''


def set_mode(target: Target, ctl: Path, mode: str) -> None:
    start = len(target.stdout)
    ctl.write_text(mode)
    target.wait_for(f"NOW {mode}", start=start)


def test_a_thread_that_cannot_start_never_ends_the_accept_loop() -> None:
    ctl = temp_dir("fp-ctl-") / "ctl"
    target = spawn(SQUEEZABLE, python=PYTHON, args=(str(ctl),))
    try:
        with connect(target.pid, timeout=60) as session:
            set_mode(target, ctl, "squeeze")
            # a request on an open connection: its thread cannot start; it says so
            with pytest.raises(RemoteCommandError, match="could not start a thread"):
                session.request("status")
            # a new connection: its thread cannot start either; it is told why, not dropped
            for _ in range(3):
                with pytest.raises(AttachFailed, match="could not start a thread"):
                    connect(target.pid, timeout=20)
            set_mode(target, ctl, "free")
            assert session.request("status")["pid"] == target.pid  # the same connection
        with connect(target.pid, timeout=30) as again:
            assert again.request("status")["pid"] == target.pid
            again.detach()
        assert target.alive() and target.stderr == ""
    finally:
        target.stop()


IDLE = r'''
import time
print("READY", flush=True)
while True:
    time.sleep(0.05)
'''


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))  # type: ignore[union-attr]


@pytest.fixture
def idle_target() -> Iterator[Target]:
    target = spawn(IDLE, python=PYTHON)
    try:
        yield target
    finally:
        target.stop()


def raw_connection(pid: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(protocol.socket_path(pid, os.geteuid()))  # blocking: waits for a backlog slot
    return sock


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return False
    except OSError:
        return True
    return True


@pytest.mark.slow
def test_idle_connections_are_capped_and_time_out_of_their_handshake(idle_target: Target) -> None:
    pid = idle_target.pid
    with connect(pid, timeout=60) as session:
        session.request("status")
        time.sleep(0.5)  # the request's own threads end
        before = threads(pid)
        idle = [raw_connection(pid) for _ in range(4 * MAX_CONNECTIONS)]
        try:
            time.sleep(1.0)
            # one thread per served connection, and only MAX_CONNECTIONS of them (the
            # session's own included); the rest were told why and closed
            assert threads(pid) <= before + MAX_CONNECTIONS, (before, threads(pid))
            with pytest.raises(AttachFailed, match=f"already serves {MAX_CONNECTIONS} connections"):
                connect(pid, timeout=20)
            assert session.request("status")["pid"] == pid  # the open session is untouched
        finally:
            for sock in idle:
                sock.close()
        # a handshake trickled a byte at a time is cut at its one deadline (10 s), not kept
        # alive by each byte
        trickle = raw_connection(pid)
        started = time.monotonic()
        header = struct.pack("!I", 64)
        cut = False
        for i in range(40):
            with contextlib.suppress(OSError):
                trickle.send(header[i % 4:i % 4 + 1])
            if closed_by_peer(trickle, 0.5):
                cut = True
                break
        assert cut and time.monotonic() - started < 18, "a trickled handshake held its connection"
        trickle.close()
        deadline = time.monotonic() + 20
        while threads(pid) > before:  # every refused or idle connection's thread is gone
            assert time.monotonic() < deadline, (before, threads(pid))
            time.sleep(0.2)
        with connect(pid, timeout=20) as again:
            again.detach()
    assert idle_target.alive() and idle_target.stderr == ""


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_log_name_that_is_no_regular_file_hangs_nothing_and_prints_nothing(
        idle_target: Target, kind: str) -> None:
    pid = idle_target.pid
    directory = protocol.socket_dir(os.geteuid())
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    log = protocol.log_path(pid, os.geteuid())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(log)
    if kind == "fifo":
        os.mkfifo(log, 0o600)  # nobody reads it: opening it for writing would block
    else:
        os.mkdir(log, 0o700)  # cannot be opened for writing at all
    try:
        started = time.monotonic()
        with connect(pid, timeout=30) as session:
            session.request("watch", {"target": {"module": "__main__", "class": None,
                                                 "method": "nothing", "nested": None}})
    except RemoteCommandError:
        pass  # no such function: an error the agent logs, with nowhere to log it
    try:
        with connect(pid, timeout=30) as session:
            session.detach()
        assert time.monotonic() - started < 30
        assert idle_target.alive()
        assert idle_target.stderr == "", idle_target.stderr[-2000:]
    finally:
        if kind == "fifo":
            os.unlink(log)
        else:
            os.rmdir(log)
