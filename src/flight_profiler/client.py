"""The CLI side of the wire: connect, handshake, request/stream/cancel, errors -> exceptions."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import struct
import time
from collections.abc import Iterator

from flight_profiler import __version__
from flight_profiler.agent import limits, protocol
from flight_profiler.client_frames import (
    LIMITS,
    AnswerLimits,
    DeadlineReached,
    FrameReader,
    FrameTimeout,
    FrameTooLarge,
)
from flight_profiler.errors import (
    AgentLost,
    AgentTimeout,
    AttachFailed,
    FlightProfilerError,
    UsageError,
    from_remote,
    malformed,
)
from flight_profiler.safe_text import safe_text

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any, Callable

    EventHandler = Callable[[dict[str, Any]], None]

# After Ctrl-C the agent removes the request's hooks and sends the final result; wait this long.
CANCEL_GRACE = 3.0
_UCRED = struct.Struct("3i")


class NoAgent(Exception):
    """Nothing (usable) answers at the socket path; the caller may inject."""


class AgentBusy(Exception):
    """An agent is listening but did not say hello in time (e.g. a thread hogs the GIL).

    Injecting again would not help: the caller should wait longer or give up."""


class RequestInterrupted(KeyboardInterrupt):
    """Ctrl-C during a request: it was cancelled (the agent removed its hooks) and drained.

    ``result`` is the agent's final answer (None if none came within the grace), ``error`` what
    ended the drain instead. A KeyboardInterrupt, so callers that only stop still stop."""

    def __init__(self, result: dict[str, Any] | None, error: FlightProfilerError | None = None) -> None:
        super().__init__("interrupted")
        self.result = result
        self.error = error


class RequestTimeout(AgentTimeout):
    """The request was cancelled at its deadline; ``partial`` is what the agent sent back then
    (None if it did not answer; ``dropped``: the connection was closed to make it stop)."""

    kind = "request_timeout"

    def __init__(self, message: str, partial: dict[str, Any] | None = None, events: int = 0,
                 dropped: bool = False) -> None:
        super().__init__(message)  # AgentTimeout's hint: a GIL-holding target, or not an agent
        self.partial = partial
        self.events = events
        self.dropped = dropped


class AgentClient:
    def __init__(self, sock: socket.socket, hello: dict[str, Any], path: str,
                 reader: FrameReader | None = None) -> None:
        self.sock = sock
        self.hello = hello
        self.path = path
        self._ids = itertools.count(1)
        self._reader = reader or FrameReader(sock)
        self.closed = False

    @classmethod
    def connect(cls, path: str, pid: int, start_time: int, timeout: float = 5.0,
                peer: tuple[int, ...] | None = None,
                limits: AnswerLimits = LIMITS) -> AgentClient:
        """Connect and handshake within ``timeout`` seconds in all; raise NoAgent if no live
        agent of THIS process answers, AgentBusy if it accepts but does not say hello in time.

        A socket file whose agent is gone (ECONNREFUSED), or whose hello names another process
        (a reused pid), is stale: it is removed so the next attach starts clean. ``peer``:
        (pid as we see it, *uids) the listening process must have (SO_PEERCRED, checked before
        a byte is sent: whoever could plant a socket there learns nothing).
        """
        deadline = time.monotonic() + timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except FileNotFoundError:
            sock.close()
            raise NoAgent("no agent socket") from None
        except socket.timeout:
            sock.close()  # a listener whose backlog is full and that never accepts
            raise AgentBusy(f"the agent's socket did not accept a connection within "
                            f"{timeout:.1f}s") from None
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.ECONNREFUSED, errno.ENOTSOCK):
                _remove_stale(path)
                raise NoAgent(f"stale agent socket removed ({exc.strerror})") from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                from flight_profiler.errors import PermissionDenied

                raise PermissionDenied(f"cannot connect to the agent at {path}: {exc.strerror}",
                                       "run as the target's user or as root") from None
            raise NoAgent(f"cannot connect: {exc}") from None
        if peer is not None:
            peer_pid, peer_uid = _peer_of(sock)
            if peer_pid != peer[0] or peer_uid not in (*peer[1:], 0):
                sock.close()
                raise NoAgent(f"the socket is served by process {peer_pid} (uid {peer_uid}), "
                              f"not by process {peer[0]}")
        reader = FrameReader(sock, limits)
        try:
            protocol.send(sock, {"type": "hello", "protocol": protocol.PROTOCOL_VERSION,
                                 "client": f"flight_profiler {__version__}"})
            # the whole handshake within the deadline: one byte a second does not hold us
            hello = reader.read(deadline, cap=limits.other_bytes)
        except (socket.timeout, DeadlineReached, FrameTimeout):
            sock.close()
            raise AgentBusy(f"the agent accepted the connection but did not answer within "
                            f"{timeout:.1f}s") from None
        except (OSError, protocol.ProtocolError, FlightProfilerError) as exc:
            sock.close()
            raise NoAgent(f"agent did not complete the handshake: {exc}") from None
        if hello is not None and hello.get("type") == "error":
            # an agent that serves but refused this connection (too many open, no thread to
            # spare): injecting again would not help, its reason is the message
            sock.close()
            error = hello.get("error")
            if not isinstance(error, dict):
                error = {}
            raise AttachFailed(f"the agent refused the connection: {error.get('message', '?')}",
                               str(error.get("hint") or "retry in a moment"))
        if hello is None or hello.get("type") != "hello":
            sock.close()
            raise NoAgent("agent closed the connection during the handshake")
        if hello.get("start_time") != start_time:
            sock.close()
            # Another process with this pid (an earlier one, or one in another pid namespace
            # sharing /tmp) answers: never trust it, and leave its socket alone.
            raise NoAgent("the agent at this socket belongs to another process with the same pid")
        if hello.get("pid") != pid:
            sock.close()
            raise NoAgent(f"agent reports pid {safe_text(hello.get('pid'), 40)}, expected {pid}")
        if hello.get("protocol") != protocol.PROTOCOL_VERSION:
            sock.close()
            raise AttachFailed(
                f"the agent in the target speaks protocol {safe_text(hello.get('protocol'), 40)}, "
                f"this CLI speaks {protocol.PROTOCOL_VERSION}",
                "detach it with the flight_profiler version that attached it, then retry",
            )
        sock.settimeout(None)
        return cls(sock, hello, path, reader)

    # -- requests --------------------------------------------------------------------------------
    def request(self, cmd: str, args: dict[str, Any] | None = None,
                on_event: EventHandler | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Send one request; call ``on_event`` per streamed event; return the result data."""
        return self.execute(cmd, args, on_event, timeout)

    def execute(self, cmd: str, args: dict[str, Any] | None = None,
                on_event: EventHandler | None = None, timeout: float | None = None,
                on_cancel: Callable[[], None] | None = None,
                grace: float = CANCEL_GRACE) -> dict[str, Any]:
        """Run one request to its end: every way of running one goes through here.

        ``timeout``: at that many seconds (wall clock, from now) a ``cancel`` is sent (the agent
        removes the request's hooks and answers with what it has: :class:`RequestTimeout`
        carries it); if no answer comes within ``grace`` more, the connection is closed, which
        the agent treats as a cancel too. Ctrl-C sends ``cancel``, calls ``on_cancel``, waits up
        to ``grace`` for the final result and raises :class:`RequestInterrupted` with it. Each
        frame must also arrive whole within the reader's ``frame_seconds``.
        """
        req_id = self.start(cmd, args)
        deadline = None if timeout is None else time.monotonic() + timeout
        events = [0]

        def deliver(data: dict[str, Any]) -> None:
            events[0] += 1
            if on_event is not None:
                try:
                    on_event(data)
                except FlightProfilerError:
                    # the caller refused an event (malformed): stop the request, then say why
                    self.cancel_and_drain(req_id, grace)
                    raise

        try:
            while True:
                try:
                    kind, data = self._next(req_id, deadline)
                except DeadlineReached:
                    assert timeout is not None
                    raise self._stop_at_deadline(req_id, timeout, grace, deliver, events) from None
                if kind == "result":
                    return data
                deliver(data)
        except KeyboardInterrupt:
            raise RequestInterrupted(*self.cancel_and_drain(req_id, grace, on_cancel)) from None

    def _stop_at_deadline(self, req_id: int, timeout: float, grace: float,
                          deliver: EventHandler, events: list[int]) -> RequestTimeout:
        """The request's time is up: cancel it, and wait ``grace`` for its final answer (the
        events still on their way are delivered and counted as before)."""
        self.cancel(req_id)
        try:
            result = self._read_until_done(req_id, deliver, grace)
        except FlightProfilerError:
            if not self.closed:  # it answered the cancel with an error: the connection is fine
                return RequestTimeout(f"cancelled after {timeout:g}s", None, events[0])
            # no answer to the cancel: the connection was closed, which cancels it too
            return RequestTimeout(f"no answer within {timeout:g}s (connection dropped)",
                                  None, events[0], True)
        return RequestTimeout(f"cancelled after {timeout:g}s", result, events[0])

    def start(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        """Send a request (refused here, before the target sees it, if beyond the agent's
        bounds)."""
        problem = limits.request_problem(args or {})
        if problem:
            raise UsageError(f"{cmd}: {problem}", "shorten or simplify it")
        req_id = next(self._ids)
        message = {"type": "request", "id": req_id, "cmd": cmd, "args": args or {}}
        frame = protocol.encode(message)
        if len(frame) > limits.MAX_REQUEST_BYTES:
            raise UsageError(f"{cmd}: a request of {len(frame)} bytes exceeds the agent's "
                             f"limit of {limits.MAX_REQUEST_BYTES}", "shorten it")
        if self.closed:
            raise AgentLost("the connection to the agent is closed", "connect again")
        try:
            self.sock.sendall(frame)
        except OSError as exc:
            raise AgentLost(f"lost the connection to the agent: {exc}") from None
        return req_id

    def messages(self, req_id: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """("event", data)* then ("result", data); an error reply raises."""
        while True:
            kind, data = self._next(req_id, None)
            yield kind, data
            if kind == "result":
                return

    def drain(self, req_id: int, timeout: float = CANCEL_GRACE) -> dict[str, Any]:
        """After a cancel: skip events until the final result."""
        return self._read_until_done(req_id, None, timeout)

    def cancel_and_drain(self, req_id: int, grace: float = CANCEL_GRACE,
                         on_cancel: Callable[[], None] | None = None,
                         ) -> tuple[dict[str, Any] | None, FlightProfilerError | None]:
        """Stop a request early: the agent removes its hooks and sends what it has. Returns
        (final result, None), or (None, what prevented it) if no result came within ``grace``.
        A second Ctrl-C while waiting propagates: the user insists on leaving."""
        self.cancel(req_id)
        if on_cancel is not None:
            on_cancel()
        try:
            return self._read_until_done(req_id, None, grace), None
        except FlightProfilerError as exc:
            return None, exc

    def cancel(self, req_id: int) -> None:
        with contextlib.suppress(AgentLost):
            self._send({"type": "cancel", "id": req_id})

    def _send(self, message: dict[str, Any]) -> None:
        if self.closed:
            raise AgentLost("the connection to the agent is closed", "connect again")
        try:
            protocol.send(self.sock, message)
        except OSError as exc:
            raise AgentLost(f"lost the connection to the agent: {exc}") from None

    def _read_until_done(self, req_id: int, on_event: EventHandler | None,
                         timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                kind, data = self._next(req_id, deadline)
            except DeadlineReached:
                self.close()  # mid-frame perhaps: the stream can no longer be trusted
                raise AgentTimeout(f"the agent did not answer within {timeout:g}s") from None
            if kind == "result":
                return data
            if on_event is not None:
                on_event(data)

    def _next(self, req_id: int, deadline: float | None) -> tuple[str, dict[str, Any]]:
        """The next ("event" | "result", data) of ``req_id``; an error reply raises.

        Raises DeadlineReached at ``deadline`` (the partial frame is kept); a frame that cannot
        be read to its end (too large, too slow, cut) closes the connection."""
        while True:
            if self.closed:
                raise AgentLost("the connection to the agent is closed", "connect again")
            try:
                message = self._reader.read(deadline)
            except (FrameTooLarge, FrameTimeout, AgentLost):
                self.close()
                raise
            if message is None:
                self.close()
                raise AgentLost("the agent closed the connection (did the target exit?)")
            if message.get("id") not in (req_id, None):  # None: the agent refused the frame
                continue
            kind = message.get("type")
            if kind in ("event", "result"):
                data = message.get("data")
                if not isinstance(data, dict):
                    raise malformed(f"{kind}: data: expected an object, got "
                                    f"{type(data).__name__}")
                return kind, data
            if kind == "error":
                raise from_remote(_error_of(message))

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def _error_of(message: dict[str, Any]) -> dict[str, Any]:
    """The ``error`` of an error reply, if it has the documented shape (strings or absent)."""
    error = message.get("error")
    if not isinstance(error, dict):
        raise malformed(f"error: expected an object, got {type(error).__name__}")
    for key in ("kind", "message", "hint"):
        if error.get(key) is not None and not isinstance(error[key], str):
            raise malformed(f"error.{key}: expected a string, got {type(error[key]).__name__}")
    return error


def _peer_of(sock: socket.socket) -> tuple[int, int]:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _gid = _UCRED.unpack(creds)
    return int(pid), int(uid)


def _remove_stale(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
