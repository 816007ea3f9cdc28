"""The agent's server, run in this process on a private temp directory: handshake, peer
credentials, one request at a time, cancel (message, Ctrl-C, disconnect) and detach remove hooks."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flight_profiler.agent import protocol, registry, server
from flight_profiler.client import AgentClient, NoAgent
from flight_profiler.errors import AgentLost, RemoteCommandError, UsageError

REMOVED: list[str] = []


def _stream(ctx: registry.Context) -> dict[str, Any]:
    ctx.add_hook("test hook on f", lambda: REMOVED.append("hook"))
    n = 0
    while not ctx.wait(0.01):
        # counted once sent: a cancel between the wait and the emit drops that event, and the
        # ticks would then be one more than the client saw (CI: 29 ticks, 28 events)
        if not ctx.emit({"tick": n + 1}):
            break
        n += 1
        if n >= int(ctx.arg("limit", 10**9)):
            break
    return {"ticks": n, "cancelled": ctx.cancelled}


def _fail(ctx: registry.Context) -> dict[str, Any]:
    raise registry.CommandError("no such method f", "check the name", "not_found")


def _crash(ctx: registry.Context) -> dict[str, Any]:
    raise ZeroDivisionError("boom")


FLOOD_DONE: list[float] = []


def _flood(ctx: registry.Context) -> dict[str, Any]:
    # what a watch hook in a hot loop of the target does: emit from the target's own thread
    start = time.monotonic()
    payload = "x" * 1000
    for i in range(30000):
        ctx.emit({"i": i, "payload": payload})
    FLOOD_DONE.append(time.monotonic() - start)
    return {"emitted": 30000}


TEST_HANDLERS = {"t_stream": _stream, "t_fail": _fail, "t_crash": _crash, "t_flood": _flood}


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real agent server in this process, on a temp dir; yields its socket path."""
    base = tempfile.mkdtemp(prefix="fps-")
    private = os.path.join(base, "d")
    monkeypatch.setattr(protocol, "socket_dir", lambda uid, root="/": os.path.join(root, private.lstrip("/")))
    real_lookup = registry.lookup
    monkeypatch.setattr(registry, "lookup", lambda cmd: TEST_HANDLERS.get(cmd) or real_lookup(cmd))
    REMOVED.clear()
    server.start({})
    try:
        yield protocol.socket_path(os.getpid(), os.geteuid())
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def _client(path: str) -> AgentClient:
    return AgentClient.connect(path, os.getpid(), protocol.process_start_time(os.getpid()))


def test_private_directory_and_socket_modes(agent: str) -> None:
    st_dir = os.lstat(os.path.dirname(agent))
    assert st_dir.st_mode & 0o777 == 0o700 and st_dir.st_uid == os.geteuid()
    assert os.lstat(agent).st_mode & 0o777 == 0o600


def test_symlinked_private_dir_is_refused(tmp_path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(PermissionError, match="not a directory"):
        server.ensure_private_dir(str(link), os.geteuid())
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    with pytest.raises(PermissionError, match="accessible to other users"):
        server.ensure_private_dir(str(loose), os.geteuid())


def test_handshake_checks_pid_and_start_time(agent: str) -> None:
    c = _client(agent)
    assert c.hello["pid"] == os.getpid() and c.hello["protocol"] == protocol.PROTOCOL_VERSION
    assert c.request("status")["pid"] == os.getpid()
    c.close()
    with pytest.raises(NoAgent, match="another process with the same pid"):
        AgentClient.connect(agent, os.getpid(), 12345)
    assert os.path.exists(agent)  # a live agent's socket is never removed


def test_remote_errors_map_to_exceptions(agent: str) -> None:
    with _ClientCtx(agent) as c:
        with pytest.raises(RemoteCommandError, match="no such method f") as err:
            c.request("t_fail")
        assert err.value.hint == "check the name"
        with pytest.raises(RemoteCommandError, match="internal error in the agent: ZeroDivisionError"):
            c.request("t_crash")
        with pytest.raises(UsageError, match="unknown command"):
            c.request("no_such_command")
        assert c.request("status")["active_hooks"] == []  # the connection is still usable


class _ClientCtx:
    def __init__(self, path: str) -> None:
        self.c = _client(path)

    def __enter__(self) -> AgentClient:
        return self.c

    def __exit__(self, *a: object) -> None:
        self.c.close()


def _hooks(path: str) -> list[str]:
    with _ClientCtx(path) as c:
        return c.request("status")["active_hooks"]


def test_cancel_message_ends_stream_and_removes_hooks(agent: str) -> None:
    with _ClientCtx(agent) as c:
        req = c.start("t_stream")
        kinds = []
        for kind, data in c.messages(req):
            kinds.append(kind)
            if kind == "event" and data["tick"] == 3:
                assert _hooks(agent) == ["test hook on f"]  # visible to a 2nd client meanwhile
                c.cancel(req)
            if kind == "result":
                assert data["cancelled"] is True
    assert REMOVED == ["hook"] and _hooks(agent) == []


def test_ctrl_c_cancels_and_waits_for_final_result(agent: str) -> None:
    seen = []

    def on_event(data: dict[str, Any]) -> None:
        seen.append(data)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with _ClientCtx(agent) as c:
        with pytest.raises(KeyboardInterrupt):
            c.request("t_stream", on_event=on_event)
        assert REMOVED == ["hook"]  # removed before the client gave control back
        assert c.request("status")["active_hooks"] == []  # same connection still works


def test_disconnect_cancels_running_request(agent: str) -> None:
    c = _client(agent)
    req = c.start("t_stream")
    next(iter(c.messages(req)))
    c.close()
    deadline = time.monotonic() + 5
    while REMOVED != ["hook"]:
        assert time.monotonic() < deadline, "hook not removed after disconnect"
        time.sleep(0.01)
    assert _hooks(agent) == []


def test_one_request_at_a_time_per_connection(agent: str) -> None:
    with _ClientCtx(agent) as c:
        req = c.start("t_stream")
        c._send({"type": "request", "id": 99, "cmd": "status", "args": {}})
        with pytest.raises(UsageError, match="one request at a time"):
            c._read_until_done(99, None, 5)
        c.cancel(req)
        assert c.drain(req)["cancelled"] is True


def test_detach_removes_hooks_closes_socket_and_other_clients(agent: str) -> None:
    other = _client(agent)
    req = other.start("t_stream")
    next(iter(other.messages(req)))
    with _ClientCtx(agent) as c:
        assert c.request("detach") == {"detached": True, "hooks_removed": 1}
    assert REMOVED == ["hook"]
    assert not os.path.exists(agent)
    assert not server.running()
    # the other client's stream ends with its final (cancelled) result, then the agent is gone
    assert other.drain(req)["cancelled"] is True
    with pytest.raises(AgentLost):
        other.request("status")
    other.close()
    # the server thread ends on its own after the detach; on a loaded machine it may take a moment
    deadline = time.monotonic() + 10
    while any(t.name.startswith(server.THREAD_PREFIX) and t.is_alive()
              for t in threading.enumerate() if t.name.endswith("server")):
        assert time.monotonic() < deadline, "the server thread outlived the detach by 10 s"
        time.sleep(0.01)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a second user")
def test_peer_credentials_refuse_another_user(agent: str) -> None:
    # GIVEN a socket another user can reach (directory and socket opened up on purpose)
    os.chmod(os.path.dirname(os.path.dirname(agent)), 0o755)
    os.chmod(os.path.dirname(agent), 0o755)
    os.chmod(agent, 0o777)
    code = (
        "import socket, struct, json, time\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({agent!r})\n"
        "body = json.dumps({'type': 'hello', 'protocol': 1}).encode()\n"
        "try:\n"
        "    s.sendall(struct.pack('>I', len(body)) + body)\n"
        "    print('refused' if s.recv(100) == b'' else 'answered')\n"
        "except (ConnectionResetError, BrokenPipeError):\n"
        "    print('refused')\n"
    )
    proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    # THEN the agent hangs up without a hello (SO_PEERCRED check)
    assert proc.stdout.strip() == "refused", proc
    os.chmod(os.path.dirname(agent), 0o700)
    assert _hooks(agent) == []  # still serving its own user


def test_forked_child_closes_inherited_listener_without_unlinking(agent: str) -> None:
    # GIVEN a running request with a hook installed
    c = _client(agent)
    req = c.start("t_stream")
    next(iter(c.messages(req)))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the at-fork hook ran; report what the child sees
        try:
            os.write(w, b"%d %s" % (int(server.running()), ",".join(REMOVED).encode()))
        finally:
            os._exit(0)
    os.close(w)
    # THEN the child does not serve, and it dropped its copy of the hook
    assert os.read(r, 100) == b"0 hook"
    os.waitpid(pid, 0)
    # and the parent's agent is intact: socket, hook, and the stream goes on
    assert os.path.exists(agent) and REMOVED == []
    assert _hooks(agent) == ["test hook on f"]
    kind, _ = next(iter(c.messages(req)))
    assert kind == "event"
    c.cancel(req)
    c.drain(req)
    c.close()


def test_a_fork_while_another_thread_holds_the_agents_locks_does_not_hang_the_child(agent: str) -> None:
    # GIVEN a running request with a hook, and another thread holding the agent state's lock and
    # the hook registry's lock at the moment of the fork (the agent's thread adding a hook while
    # a DataLoader forks a worker)
    from flight_profiler.agent import hook_registry

    c = _client(agent)
    req = c.start("t_stream")
    next(iter(c.messages(req)))
    state = server._server.state  # type: ignore[union-attr]
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with state._lock, hook_registry.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the at-fork hook ran (it would hang here on the old code)
        try:
            os.write(w, b"%d" % int(server.running()))
        finally:
            os._exit(0)
    release.set()
    t.join(10)
    os.close(w)
    done = select.select([r], [], [], 10)[0]
    # THEN the child got through its fork handler at once
    if not done:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert done and os.read(r, 10) == b"0"
    c.cancel(req)
    c.drain(req)
    c.close()


def test_stale_socket_is_detected_and_removed(tmp_path) -> None:
    path = str(tmp_path / "agent.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # a socket file nobody listens on: what a SIGKILLed agent leaves behind
    with pytest.raises(NoAgent, match="stale"):
        AgentClient.connect(path, os.getpid(), 0)
    assert not os.path.exists(path)


def test_api_session_stream_and_early_break_cancels(agent: str) -> None:
    from flight_profiler.api import Session

    session = Session(os.getpid(), _client(agent), injected=False, attach_seconds=0.0)
    events = []
    for event in session.stream("t_stream", {"limit": 1000}):
        events.append(event["tick"])
        if len(events) == 3:
            break  # leaving the loop cancels the request
    assert events == [1, 2, 3]
    assert session.last_result is not None and session.last_result["cancelled"] is True
    assert REMOVED == ["hook"]
    # a stream that ends by itself returns its result the same way
    assert [e["tick"] for e in session.stream("t_stream", {"limit": 2})] == [1, 2]
    assert session.last_result == {"ticks": 2, "cancelled": False}
    with session:
        assert session.request("status")["active_hooks"] == []
    assert session.client is None  # the with-block closed it


def test_a_client_that_does_not_read_never_blocks_the_emitter(agent: str) -> None:
    # GIVEN a client that sends a request and then does not read for a while
    FLOOD_DONE.clear()
    with _ClientCtx(agent) as c:
        req = c.start("t_flood")
        deadline = time.monotonic() + 10
        while not FLOOD_DONE:
            assert time.monotonic() < deadline, "emit blocked on a client that does not read"
            time.sleep(0.01)
        # THEN 30 MB of events were emitted without waiting for the socket
        assert FLOOD_DONE[0] < 5.0
        events, result = 0, None
        for kind, data in c.messages(req):
            if kind == "event":
                events += 1
            else:
                result = data
        # and every event is either delivered (in order, before the result) or counted as dropped
        assert result is not None
        assert events + result.get("events_dropped", 0) == 30000
