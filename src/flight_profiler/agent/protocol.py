"""Wire protocol shared by the CLI and the agent. Standard library only.

Frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON (one object). JSON only:
a pickle on the wire would let whoever reaches the socket run code in the target.

Conversation on one connection::

    client -> {"type": "hello", "protocol": 1, "client": "flight_profiler 0.1.0"}
    agent  -> {"type": "hello", "protocol": 1, "agent_version": "...", "pid": 123,
               "start_time": 456789}        # start_time: /proc/<pid>/stat field 22, in ticks
    client -> {"type": "request", "id": 1, "cmd": "watch", "args": {...}}
    agent  -> {"type": "event", "id": 1, "data": {...}}      # zero or more, for streams
    agent  -> {"type": "result", "id": 1, "data": {...}}     # exactly one of result / error
           or {"type": "error", "id": 1, "error": {"kind": "...", "message": "...", "hint": "..."}}
    client -> {"type": "cancel", "id": 1}   # any time during a stream: the agent removes the
                                            # request's hooks and sends the final result

One request at a time per connection; open more connections for concurrency. A client that
disconnects is treated as a cancel of its running request.
"""

from __future__ import annotations

import json
import os
import socket
import struct

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct(">I")

# Error kinds the agent may report (the CLI maps them to exit codes in errors.py).
ERR_USAGE = "usage"
ERR_NOT_FOUND = "not_found"
ERR_TORCH_MISSING = "torch_missing"
ERR_FAILED = "failed"
ERR_INTERNAL = "internal"


class ProtocolError(Exception):
    """A malformed or oversized frame, or a peer that speaks another protocol."""


def socket_dir(uid: int, root: str = "/") -> str:
    """Private directory (0700, owned by ``uid``) holding the agent sockets and logs.

    ``root`` lets the CLI reach a containerised target through ``/proc/<pid>/root``.
    """
    return os.path.join(root, "tmp", f"flight_profiler-{uid}")


def mixed_uids(uids: tuple[int, ...]) -> bool:
    """Whether a process's real, effective, saved and file-system uids differ (``/proc/PID/
    status`` ``Uid:``): a root job that called ``seteuid(1000)`` keeps real and saved uid 0 and
    can take root back at any moment."""
    return len(set(uids)) > 1


def home_uid(uids: tuple[int, ...]) -> int:
    """Whose private directory holds a process's agent socket and log: its one uid, or root's
    for a process with mixed uids (only root may talk to such an agent: see ``serves``)."""
    return 0 if mixed_uids(uids) else uids[0]


def serves(peer_uid: int, uids: tuple[int, ...], proc_owner: int) -> bool:
    """Whether the agent of a process with ``uids`` may serve a client of ``peer_uid``.

    What the kernel weighs before it lets a user ptrace the process, and no more: root always;
    another user only if every one of the process's uids is theirs and the process is
    dumpable (``proc_owner``, the owner of ``/proc/PID``, is then that uid; the kernel makes
    it root's for a process that changed uids or called ``prctl(PR_SET_DUMPABLE, 0)``).
    """
    if peer_uid == 0:
        return True
    return not mixed_uids(uids) and peer_uid == uids[0] and proc_owner == peer_uid


def process_uids(pid: int | str = "self") -> tuple[int, int, int, int]:
    """Real, effective, saved and file-system uids of ``pid`` (``Uid:`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                ids = [int(x) for x in line.split()[1:5]]
                if len(ids) == 4:
                    return (ids[0], ids[1], ids[2], ids[3])
    raise ValueError(f"no Uid line in /proc/{pid}/status")


def pid_namespace(pid: int | str = "self") -> int:
    """Inode of ``pid``'s pid namespace (0 if unknown): two processes with the same pid in two
    namespaces (containers sharing /tmp, both pid 1) differ by it."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


def agent_key(pid: int, pidns: int | None = None) -> str:
    """What names one process's files in the private directory: ``<pid namespace>-<pid>``."""
    ns = pid_namespace() if pidns is None else pidns
    return f"{ns}-{pid}" if ns else str(pid)


def socket_name(pid: int, pidns: int | None = None) -> str:
    return f"agent-{agent_key(pid, pidns)}.sock"


# Infix of the files beside an agent's log that hold the target's stderr while torch's profiler
# runs (torch_support.QuietStderr); the CLI reads them when the target dies meanwhile
# (attach/last_words.py).
HELD_STDERR = ".held-stderr-"


def log_name(pid: int, pidns: int | None = None) -> str:
    return f"agent-{agent_key(pid, pidns)}.log"


def lock_name(pid: int, pidns: int | None = None) -> str:
    return f".attach-{agent_key(pid, pidns)}.lock"


def socket_path(pid: int, uid: int, root: str = "/", pidns: int | None = None) -> str:
    """``pidns`` defaults to the caller's own pid namespace."""
    return os.path.join(socket_dir(uid, root), socket_name(pid, pidns))


def log_path(pid: int, uid: int, root: str = "/", pidns: int | None = None) -> str:
    return os.path.join(socket_dir(uid, root), log_name(pid, pidns))


def process_start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (/proc/<pid>/stat field 22).

    pids get reused; (pid, start_time) names one process for its whole life.
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])


# One encoder for every frame: json.dumps with options builds a JSONEncoder per call, a good
# part of a small event's cost when a watch streams thousands a second (encode is reentrant).
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def encode(message: dict[str, Any]) -> bytes:
    body = _ENCODER.encode(message).encode("utf-8")
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES} limit")
    return _HEADER.pack(len(body)) + body


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    remaining = n
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            if remaining == n:
                return None
            raise ProtocolError("connection closed in the middle of a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class FrameTooLarge(ProtocolError):
    """A frame announced beyond the reader's limit (its body was not read)."""


def recv(sock: socket.socket, limit: int = MAX_FRAME_BYTES) -> dict[str, Any] | None:
    """Read one message of at most ``limit`` bytes; ``None`` on a clean end of stream."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > limit:
        raise FrameTooLarge(f"a message of {length} bytes exceeds the limit of {limit}")
    body = _recv_exact(sock, length)
    if body is None:
        raise ProtocolError("connection closed before the frame body")
    try:
        message = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ProtocolError(f"frame is not JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message
