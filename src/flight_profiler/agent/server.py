"""The agent's door: a daemon thread serving a private Unix socket inside the target.

Security: the socket lives in a directory only the target's user can enter (0700, owned by that
uid, checked with lstat so a planted symlink is refused), the socket itself is 0600, and every
connection's peer uid (SO_PEERCRED) must be one the kernel would let ptrace the process: root,
or its user if all its uids are that user's (``credentials``). A process with mixed uids (a root
job that called seteuid) is served to root alone, from root's directory. JSON frames only.

Each connection gets a reader thread; each request runs in its own worker thread so that the
reader can still see ``cancel`` or a disconnect and cancel the request. ``detach`` removes every
hook, closes the socket and ends the threads: a later attach injects afresh.

Logs go to protocol.log_path only (bounded: one rotation), never to the target's stdout/stderr,
and only if that is a regular file (agent_log.py).

Availability: at most MAX_CONNECTIONS connections are served at once (the extra ones get an
error frame saying so, and are closed), a handshake has one deadline however slowly its bytes
come, and no failure with one connection (a thread that cannot start) ends the accept loop.

The socket can vanish under a running agent (a tmp cleaner; a twin in another pid namespace once
shared the name): a later attach runs the bootstrap again, whose ``start`` finds the server
running and binds it a fresh socket. Sockets are named after the pid namespace and the pid.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import socket
import stat
import struct
import sys
import threading
import time

from . import agent_log, credentials, limits, protocol, registry
from .outbox import Outbox

TYPE_CHECKING = False  # not typing's: a target without it pays ~5 ms for it (issue 23)
if TYPE_CHECKING:
    from typing import Any

AGENT_VERSION = "0.1.0"
THREAD_PREFIX = "flight_profiler-"  # the agent's threads; `stack` hides them by default
_HELLO_TIMEOUT = 10.0  # the whole handshake, however slowly its bytes come
# Connections served at once (each has a thread, and a request two more). The CLI uses one per
# command or shell; a few sessions side by side fit. Beyond it a connection is told why and
# closed, so a flood of idle connections cannot multiply the target's threads.
MAX_CONNECTIONS = 8
_REFUSED_GRACE = 1.0  # a refused connection stays open (write side shut) this long, for the
#                       client to read why before it sees the end
_UCRED = struct.Struct("3i")

log = agent_log.LOG  # written without importing logging (agent_log.py)

_lock = threading.Lock()
_server: Server | None = None
_fork_hook_installed = False
_atexit_installed = False
_in_use_fd: int | None = None


class Server:
    def __init__(self, params: dict[str, Any]) -> None:
        self.pid = os.getpid()
        self.uid = credentials.home_uid()  # whose directory holds the socket and log
        self.start_time = protocol.process_start_time(self.pid)
        self.directory = protocol.socket_dir(self.uid)
        self.path = _socket_path(self.directory, params)
        self.log_path = _log_path(self.directory, params)
        self._bound: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket file we bound
        self.state = registry.AgentState(AGENT_VERSION)
        self.params = dict(params)
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._live: set[Connection] = set()  # connections past the handshake
        self._conns_lock = threading.Lock()
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._refused: collections.deque[tuple[float, socket.socket]] = collections.deque()

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        self.listener = self._bind()
        self.thread = threading.Thread(
            target=self._serve, name=THREAD_PREFIX + "server", daemon=True
        )
        self.thread.start()
        log.info("agent %s listening on %s", AGENT_VERSION, self.path)

    def _bind(self) -> socket.socket:
        return credentials.as_home(self.uid, self._bind_in_home)

    def _bind_in_home(self) -> socket.socket:
        ensure_private_dir(self.directory, self.uid)
        tmp = os.path.join(self.directory, f".agent-{self.pid}-{threading.get_ident()}.tmp")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            listener.bind(tmp)
            os.chmod(tmp, 0o600)
            listener.listen(16)
            st = os.lstat(tmp)
            # rename is atomic and replaces a stale socket left by a dead process of this pid
            os.rename(tmp, self.path)
        except BaseException:
            listener.close()
            raise
        self._bound = (st.st_dev, st.st_ino)
        return listener

    def socket_intact(self) -> bool:
        """Whether our socket file is still where clients look for it."""
        return self.socket_intact_at(self.path)

    def rebind(self, params: dict[str, Any]) -> None:
        """Give a running server its socket back (under the name ``params`` asks for)."""
        path = _socket_path(self.directory, params)
        if path == self.path and self.socket_intact():
            return
        old_path, self.path = self.path, path
        if old_path != path and self.socket_intact_at(old_path):
            with contextlib.suppress(OSError):
                credentials.as_home(self.uid, lambda: os.unlink(old_path))
        listener = self._bind()
        old, self.listener = self.listener, listener
        if old is not None:  # wakes the accept loop, which then takes the new listener
            _shutdown_quietly(old)
            old.close()
        log.info("socket lost: listening again on %s", self.path)

    def socket_intact_at(self, path: str) -> bool:
        try:
            st = credentials.as_home(self.uid, lambda: os.lstat(path))
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._bound

    def running(self) -> bool:
        return self.listener is not None and not self._stopping.is_set()

    def stop(self, keep: socket.socket | None = None) -> int:
        """Remove all hooks, close every connection (but ``keep``, the one asking) and the
        socket. Returns the number of hooks removed."""
        if self._stopping.is_set():
            return 0
        self._stopping.set()
        removed = len(self.state.active_hooks())
        self.state.remove_all()
        listener, self.listener = self.listener, None
        if listener is not None:
            self._unlink_if_ours()
            _shutdown_quietly(listener)  # wakes the thread blocked in accept()
            listener.close()
        with self._conns_lock:
            conns = list(self._conns)
            live = list(self._live)
        # let cancelled requests deliver their final result before hanging up
        for connection in live:
            if connection.conn is not keep:
                connection._cancel_running(wait=True, timeout=1.0)
        for conn in conns:
            if conn is not keep:
                _shutdown_quietly(conn)
        log.info("agent stopped (%d hooks removed)", removed)
        return removed

    def _unlink_if_ours(self) -> None:
        # Only the process that created the socket may remove it (never a forked child), and
        # only if the file there is still the one it bound (not a twin's).
        if os.getpid() != self.pid or not self.socket_intact():
            return
        with contextlib.suppress(OSError):
            credentials.as_home(self.uid, lambda: os.unlink(self.path))

    # -- serving -------------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._accept_loop()
        except BaseException:  # never reach threading.excepthook (it prints to stderr)
            log.exception("server thread failed")

    def _accept_loop(self) -> None:
        """Accept until stopped. Nothing that goes wrong with one connection (no thread can be
        started for it, say, when the address space is squeezed) ends the loop: it would leave
        the agent unreachable for good, detach included."""
        while not self._stopping.is_set():
            listener = self.listener
            if listener is None:
                break
            try:
                self._close_refused(all_of_them=False)
                listener.settimeout(_REFUSED_GRACE / 2 if self._refused else None)
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.is_set():
                    break
                if listener is not self.listener:
                    continue  # rebound: serve the new socket
                time.sleep(0.05)  # e.g. EMFILE: do not spin
                continue
            except BaseException:
                log.exception("accept failed")
                time.sleep(0.05)
                continue
            self._start_connection(conn)
        self._close_refused(all_of_them=True)

    def _start_connection(self, conn: socket.socket) -> None:
        try:
            if not self._slots.acquire(blocking=False):
                log.warning("refused a connection: %d already open", MAX_CONNECTIONS)
                self._refuse(conn, f"the agent already serves {MAX_CONNECTIONS} connections, "
                             "its limit", "close other flight_profiler sessions on this "
                             "process (shells, watches), or retry when they end")
                return
            try:
                threading.Thread(
                    target=self._serve_slot, args=(conn,), name=THREAD_PREFIX + "conn",
                    daemon=True,
                ).start()
            except BaseException as exc:
                self._slots.release()
                log.warning("cannot start a connection thread: %s: %s", type(exc).__name__, exc)
                self._refuse(conn, "the agent could not start a thread for this connection "
                             f"({type(exc).__name__}: {exc})", "the process is short of memory "
                             "or threads: retry in a moment")
        except BaseException:
            log.exception("connection set-up failed")
            _shutdown_quietly(conn)
            conn.close()
            time.sleep(0.05)

    def _serve_slot(self, conn: socket.socket) -> None:
        try:
            self._serve_connection(conn)
        finally:
            self._slots.release()

    def _refuse(self, conn: socket.socket, message: str, hint: str) -> None:
        """Say why in one error frame (never waiting for the client), shut our side, and close
        it a moment later: closed at once, the client's hello could meet a broken pipe before
        it reads why."""
        try:
            conn.setblocking(False)
            conn.send(protocol.encode({"type": "error", "id": None, "error": {
                "kind": protocol.ERR_FAILED, "message": message, "hint": hint}}))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if len(self._refused) >= 4 * MAX_CONNECTIONS:  # a flood: no grace for the oldest
            _, oldest = self._refused.popleft()
            oldest.close()
        self._refused.append((time.monotonic() + _REFUSED_GRACE, conn))

    def _close_refused(self, all_of_them: bool) -> None:
        now = time.monotonic()
        while self._refused and (all_of_them or self._refused[0][0] <= now):
            _, conn = self._refused.popleft()
            conn.close()

    def _serve_connection(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.add(conn)
        try:
            peer_uid = self._peer_uid(conn)
            if not credentials.may_connect(peer_uid):
                log.warning("refused a connection from uid %s", peer_uid)
                return
            connection = Connection(self, conn)
            with self._conns_lock:
                self._live.add(connection)
            try:
                connection.run()
            finally:
                with self._conns_lock:
                    self._live.discard(connection)
        except (OSError, protocol.ProtocolError) as exc:
            log.info("connection ended: %s", exc)
        except BaseException:
            log.exception("connection failed")
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            _shutdown_quietly(conn)
            conn.close()

    @staticmethod
    def _peer_uid(conn: socket.socket) -> int:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        _pid, uid, _gid = _UCRED.unpack(creds)
        return int(uid)

    def hello(self) -> dict[str, Any]:
        return {
            "type": "hello",
            "protocol": protocol.PROTOCOL_VERSION,
            "agent_version": AGENT_VERSION,
            "pid": self.pid,
            "start_time": self.start_time,
            "python": ".".join(map(str, sys.version_info[:3])),
        }


class Connection:
    """One client: handshake, then requests one at a time; cancel or EOF cancels the running one."""

    def __init__(self, server: Server, conn: socket.socket) -> None:
        self.server = server
        self.conn = conn
        self._send_lock = threading.Lock()
        self._ctx: registry.Context | None = None
        self._req_id: object = None  # the JSON id the client chose: echoed, never interpreted
        self._worker: threading.Thread | None = None
        self._busy = False  # a request is running (cleared before its final message is sent)

    def send(self, message: dict[str, Any]) -> None:
        self.send_bytes(protocol.encode(message))

    def send_bytes(self, data: bytes) -> None:
        """Write whole frames (one or several) at once."""
        with self._send_lock:
            self.conn.sendall(data)

    def run(self) -> None:
        # One deadline for the whole handshake: a client trickling a byte at a time must not
        # hold a connection (and its thread) for longer.
        reader: socket.socket = _Deadline(  # type: ignore[assignment]  # reads like a socket
            self.conn, time.monotonic() + _HELLO_TIMEOUT)
        hello = protocol.recv(reader, limits.MAX_REQUEST_BYTES)
        if hello is None or hello.get("type") != "hello":
            return
        self.send(self.server.hello())
        self.conn.settimeout(None)
        try:
            while True:
                try:
                    message = protocol.recv(self.conn, limits.MAX_REQUEST_BYTES)
                except protocol.FrameTooLarge as exc:
                    # its body was not read: the stream is out of step, hang up after saying why
                    self._error(None, protocol.ERR_USAGE, f"request refused: {exc}",
                                "send smaller requests (shorter expressions)")
                    return
                if message is None:
                    return
                if not self._dispatch(message):
                    return
        finally:
            self._cancel_running(wait=True)

    def _dispatch(self, message: dict[str, Any]) -> bool:
        kind = message.get("type")
        if kind == "cancel":
            if self._ctx is not None and message.get("id") in (None, self._req_id):
                self._ctx.cancel()
            return True
        if kind != "request":
            self._error(message.get("id"), protocol.ERR_USAGE, f"unexpected message {kind!r}")
            return True
        req_id, cmd = message.get("id"), str(message.get("cmd", ""))
        if self._busy:
            self._error(req_id, protocol.ERR_USAGE, "one request at a time per connection",
                        "open another connection for concurrent requests")
            return True
        if cmd == "detach":
            self._cancel_running(wait=True)
            removed = self.server.stop(keep=self.conn)
            self.send({"type": "result", "id": req_id,
                       "data": {"detached": True, "hooks_removed": removed}})
            return False
        args = message.get("args") or {}
        problem = limits.request_problem(args)
        if problem:
            self._error(req_id, protocol.ERR_USAGE, f"{cmd}: request refused: {problem}",
                        "shorten or simplify it")
            return True
        outbox = Outbox(self.send, req_id, THREAD_PREFIX + "events", encode=protocol.encode,
                        send_bytes=self.send_bytes)
        ctx = registry.Context(args if isinstance(args, dict) else {},
                               emit=outbox.emit, agent=self.server.state)
        worker = threading.Thread(
            target=self._run_request, args=(ctx, req_id, cmd, outbox),
            name=THREAD_PREFIX + "request", daemon=True,
        )
        self._ctx, self._req_id, self._busy, self._worker = ctx, req_id, True, worker
        try:
            worker.start()
        except BaseException as exc:  # no thread to spare: say so, keep the connection
            self._ctx, self._busy, self._worker = None, False, None
            log.warning("%s: cannot start its thread: %s: %s", cmd, type(exc).__name__, exc)
            self._error(req_id, protocol.ERR_FAILED,
                        f"{cmd}: the agent could not start a thread for it "
                        f"({type(exc).__name__}: {exc})",
                        "the process is short of memory or threads: retry in a moment")
        return True

    def _run_request(self, ctx: registry.Context, req_id: Any, cmd: str, outbox: Outbox) -> None:
        try:
            try:
                try:
                    data = registry.run(ctx, cmd)
                finally:
                    outbox.flush()  # every event goes out before the result
                if outbox.dropped:
                    log.warning("%s: %d events dropped (client too slow)", cmd, outbox.dropped)
                    if isinstance(data, dict):
                        data["events_dropped"] = outbox.dropped
            except registry.CommandError as exc:
                self._busy = False
                self._error(req_id, exc.kind, exc.message, exc.hint)
                return
            except BaseException as exc:
                self._busy = False
                log.exception("command %r failed", cmd)
                self._error(req_id, protocol.ERR_INTERNAL,
                            f"internal error in the agent: {type(exc).__name__}: {exc}",
                            f"see the agent log {self.server.log_path}")
                return
            self._busy = False
            try:
                self.send({"type": "result", "id": req_id, "data": data})
            except protocol.ProtocolError as exc:
                self._error(req_id, protocol.ERR_FAILED, str(exc))
            finally:
                del data  # keep no reference to anything of the target's
        except OSError:
            pass  # the client is gone; registry.run already removed the hooks

    def _error(self, req_id: Any, kind: str, message: str, hint: str = "") -> None:
        with contextlib.suppress(OSError):
            self.send({"type": "error", "id": req_id,
                       "error": {"kind": kind, "message": message, "hint": hint}})

    def _cancel_running(self, wait: bool, timeout: float = 5.0) -> None:
        ctx, worker = self._ctx, self._worker
        if ctx is not None:
            ctx.cancel()
        if wait and worker is not None and worker is not threading.current_thread():
            worker.join(timeout)


class _Deadline:
    """A socket whose every recv waits at most until one deadline (protocol.recv reads a frame
    in several recv calls; a per-call timeout would restart with each byte)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline

    def recv(self, size: int) -> bytes:
        # A little time even when late: a hello already waiting is still read, however long
        # this thread waited for the GIL.
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.01))
        return self.sock.recv(size)


def ensure_private_dir(directory: str, uid: int) -> None:
    """Create ``directory`` 0700, or accept it only if it is a real directory of ``uid``, 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{directory} is not a directory (a symlink?)")
    if st.st_uid != uid:
        raise PermissionError(f"{directory} belongs to uid {st.st_uid}, not {uid}")
    if st.st_mode & 0o077:
        raise PermissionError(f"{directory} is accessible to other users")


def _shutdown_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) must not serve or touch the parent's clients."""
    global _server
    agent_log.LOG.after_fork()
    server, _server = _server, None
    if server is None:
        return
    listener, server.listener = server.listener, None
    if listener is not None:
        listener.close()  # close only; the path belongs to the parent
    for conn in list(server._conns):
        conn.close()
    server._stopping.set()
    # Only the forking thread exists here: a lock another thread held at the fork stays held for
    # ever. Renewed before any use: a DataLoader worker forked while the agent's thread added a
    # hook would hang in active_hooks(), and the job's loop with it (tests/unit/test_server.py).
    server.state._lock = threading.Lock()
    if server.state.active_hooks():
        # the child has no client: its copies of the hooks must go, but never by waiting for the
        # hook registry's lock; hooks.py's own fork handler gives the functions back without it
        registry = sys.modules.get(f"{__package__}.hook_registry")
        lock = getattr(registry, "lock", None)
        if lock is None or lock.acquire(blocking=False):
            try:
                server.state.remove_all()
            finally:
                if lock is not None:
                    lock.release()


def _at_exit() -> None:
    server = _server
    if server is not None and os.getpid() == server.pid:
        server._unlink_if_ours()


def running() -> bool:
    server = _server
    return server is not None and server.running() and os.getpid() == server.pid


def _socket_path(directory: str, params: dict[str, Any]) -> str:
    name = params.get("sock")
    if not isinstance(name, str) or not name:
        name = protocol.socket_name(os.getpid())
    return os.path.join(directory, os.path.basename(name))


def _log_path(directory: str, params: dict[str, Any]) -> str:
    name = params.get("log")
    if not isinstance(name, str) or not name:
        name = protocol.log_name(os.getpid())
    return os.path.join(directory, os.path.basename(name))


def _hold_staged_copy(params: dict[str, Any]) -> None:
    """Hold a shared lock on our staged copy's marker for the process's life, so that a CLI
    cleaning old versions leaves it alone (modules of it may still be imported lazily)."""
    global _in_use_fd
    pkg = params.get("pkg")
    if _in_use_fd is not None or not isinstance(pkg, str):
        return
    import fcntl

    try:
        fd = os.open(os.path.join(os.path.dirname(pkg), "in-use"),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:  # never wait here: this may run on the target's main thread
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    _in_use_fd = fd


def start(params: dict[str, Any]) -> None:
    """Start serving unless an agent already does (idempotent); give a running one whose
    socket vanished a new socket."""
    global _server, _fork_hook_installed, _atexit_installed
    with _lock:
        if running():
            assert _server is not None
            _server.rebind(params)
            return
        uid = credentials.home_uid()
        credentials.as_home(uid, lambda: ensure_private_dir(protocol.socket_dir(uid), uid))
        server = Server(params)
        agent_log.setup(server.log_path, uid)
        _hold_staged_copy(params)
        server.open()
        _server = server
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_installed = True
        if not _atexit_installed:
            atexit.register(_at_exit)
            _atexit_installed = True


def stop() -> int:
    server = _server
    return server.stop() if server is not None else 0
