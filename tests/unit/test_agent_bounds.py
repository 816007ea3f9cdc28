"""Whatever a client sends, the agent refuses it before working in the target, keeps no extra
thread after a request, and can always be reached again (a lost socket is given back)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flight_profiler.agent import limits, protocol, registry, server
from flight_profiler.agent.outbox import Outbox
from flight_profiler.client import AgentClient
from flight_profiler.errors import UsageError


def _flood(ctx: registry.Context) -> dict[str, Any]:
    for i in range(20000):
        ctx.emit({"i": i, "payload": "x" * 500})
    return {"emitted": 20000}


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    base = tempfile.mkdtemp(prefix="fpb-")
    private = os.path.join(base, "d")
    monkeypatch.setattr(protocol, "socket_dir",
                        lambda uid, root="/": os.path.join(root, private.lstrip("/")))
    real_lookup = registry.lookup
    monkeypatch.setattr(registry, "lookup", lambda cmd: {"t_flood": _flood}.get(cmd) or real_lookup(cmd))
    server.start({})
    try:
        yield protocol.socket_path(os.getpid(), os.geteuid())
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def _client(path: str) -> AgentClient:
    return AgentClient.connect(path, os.getpid(), protocol.process_start_time(os.getpid()))


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    protocol.send(s, {"type": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert protocol.recv(s)["type"] == "hello"  # type: ignore[index]
    return s


def test_expression_bounds_are_linear_checks() -> None:
    assert limits.expression_problem("params[0].shape, cost") is None
    assert limits.expression_problem("f(" * 40 + ")" * 40) is None
    assert "nested" in (limits.expression_problem("(" * 1000 + ")" * 1000) or "")
    assert "nested" in (limits.expression_problem("-" * 200 + "x") or "")
    assert "characters" in (limits.expression_problem("x+" * 10**6 + "x") or "")
    assert limits.expression_problem("'((((((((((((((((((((((((((((((((((((((((((((((((((((((('") is None
    start = time.perf_counter()
    limits.expression_problem("(" * 10**7)  # 10 MB: refused without work proportional to it
    assert time.perf_counter() - start < 1.0
    assert limits.request_problem({"expr": "a," * 100 + "a"}) is not None  # 101 expressions
    assert limits.request_problem({"filter": "cost > 5", "count": 3}) is None
    assert limits.request_problem({"x": [[[[[[[[[[1]]]]]]]]]]}) is not None


def test_oversized_frame_is_refused_with_a_usage_error(agent: str) -> None:
    # GIVEN a raw client announcing a 10 MB request
    s = _raw(agent)
    try:
        s.sendall(struct.pack(">I", 10 * 1024 * 1024) + b"{" * 4096)
        # THEN the agent answers with a usage error (not reading the body) and hangs up
        reply = protocol.recv(s)
        assert reply is not None and reply["type"] == "error"
        assert reply["error"]["kind"] == protocol.ERR_USAGE and "exceeds" in reply["error"]["message"]
        # (a reset is also an end: it hung up with our unread body in its buffer)
        with contextlib.suppress(ConnectionResetError):
            assert protocol.recv(s) is None
    finally:
        s.close()
    with _ClientCtxt(agent) as c:  # and stays reachable
        assert c.request("status")["pid"] == os.getpid()


class _ClientCtxt:
    def __init__(self, path: str) -> None:
        self.c = _client(path)

    def __enter__(self) -> AgentClient:
        return self.c

    def __exit__(self, *a: object) -> None:
        self.c.close()


def test_huge_or_deep_expression_refused_before_any_work(agent: str) -> None:
    # GIVEN a raw client that bypasses the CLI's own check; WHEN it sends a 40 KB --expr and a
    # deeply nested -f THEN each is a usage error at once, and the connection stays usable
    s = _raw(agent)
    try:
        for n, args in enumerate([{"expr": "x+" * 20_000 + "x"},
                                  {"filter": "(" * 1000 + "1" + ")" * 1000}]):
            start = time.monotonic()
            protocol.send(s, {"type": "request", "id": n, "cmd": "watch",
                              "args": {"module": "__main__", "method": "f", **args}})
            reply = protocol.recv(s)
            assert reply is not None and reply["type"] == "error", reply
            assert reply["error"]["kind"] == protocol.ERR_USAGE
            assert "request refused" in reply["error"]["message"]
            assert time.monotonic() - start < 2.0
    finally:
        s.close()


def test_client_refuses_a_request_beyond_the_bounds_without_sending_it(agent: str) -> None:
    with _ClientCtxt(agent) as c:
        with pytest.raises(UsageError, match="characters"):
            c.start("watch", {"module": "m", "method": "f", "expr": "x" * (10 * 1024 * 1024)})
        assert c.request("status")["pid"] == os.getpid()


def test_outbox_sender_ends_even_when_flush_drained_its_stop_marker() -> None:
    # GIVEN a sender stuck in a send to a client that does not read
    release = threading.Event()

    def send(_: dict[str, Any]) -> None:
        release.wait(10)
        raise OSError("client gone")

    box = Outbox(send, 1, "fp-test-events", limit=100)
    for i in range(50):
        box.emit({"i": i})
    box.flush(timeout=0.2)  # gives up on the stuck sender and drops the queue
    thread = box._thread
    assert thread is not None and thread.is_alive()
    # WHEN the send finally fails (the client went away) THEN the thread ends
    release.set()
    thread.join(5)
    assert not thread.is_alive()


def test_threads_after_flooding_requests_are_what_they_were(agent: str) -> None:
    def ours() -> int:
        return sum(1 for t in threading.enumerate() if t.name.startswith("flight_profiler-"))

    with _ClientCtxt(agent) as c:
        c.request("status")
        time.sleep(0.2)
        before = ours()
    for _ in range(5):
        # a client that reads nothing and goes away mid-flood
        s = _raw(agent)
        protocol.send(s, {"type": "request", "id": 1, "cmd": "t_flood", "args": {}})
        time.sleep(0.2)
        s.close()
    deadline = time.monotonic() + 15
    with _ClientCtxt(agent) as c:
        c.request("status")
        while ours() > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ours() == before, [t.name for t in threading.enumerate()]


def test_lost_socket_is_given_back_by_start_and_the_agent_keeps_its_state(agent: str) -> None:
    # GIVEN a running agent with a connected client, whose socket file a tmp cleaner removed
    keep = _client(agent)
    os.unlink(agent)
    # WHEN the bootstrap runs again (what a re-attach does)
    server.start({})
    # THEN the same server listens again at the same name; the old connection still works
    assert os.path.exists(agent)
    with _ClientCtxt(agent) as c:
        assert c.request("status")["pid"] == os.getpid()
    assert keep.request("status")["pid"] == os.getpid()
    keep.close()
    # and a socket file replaced by another (a pid-namespace twin's) is not taken for ours
    os.unlink(agent)
    squatter = socket.socket(socket.AF_UNIX)
    squatter.bind(agent)
    try:
        assert server._server is not None and not server._server.socket_intact()
        server.start({})
        with _ClientCtxt(agent) as c:
            assert c.request("status")["pid"] == os.getpid()
    finally:
        squatter.close()


def test_outbox_writes_what_is_queued_in_one_send_in_order() -> None:
    # GIVEN a sender that cannot start writing until 200 events are queued
    gate = threading.Event()
    writes: list[bytes] = []

    def send_bytes(data: bytes) -> None:
        gate.wait(10)
        writes.append(data)

    box = Outbox(lambda m: None, 7, "fp-test-events", encode=protocol.encode, send_bytes=send_bytes)
    box.emit({"i": 0})
    time.sleep(0.1)  # the sender took the first event and waits in its write
    for i in range(1, 200):
        box.emit({"i": i, "bad": {(1, 2): 0}} if i == 100 else {"i": i})
    gate.set()
    box.flush()
    # THEN the other 199 went out in one write (not one write, and one GIL hand-off, each), in
    # order, the one that cannot be encoded counted as dropped
    assert len(writes) == 2
    sock_a, sock_b = socket.socketpair()
    with sock_a, sock_b:
        sock_a.sendall(b"".join(writes))
        sock_a.shutdown(socket.SHUT_WR)
        got = []
        while (message := protocol.recv(sock_b)) is not None:
            got.append(message["data"]["i"])
    assert got == [i for i in range(200) if i != 100] and box.dropped == 1
