"""Wire framing: 4-byte big-endian length + a UTF-8 JSON object; nothing else is accepted."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from flight_profiler.agent import protocol


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def test_roundtrip_and_clean_end() -> None:
    a, b = _pair()
    message = {"type": "event", "id": 3, "data": {"name": "ünïcode", "n": [1, 2.5, None]}}
    protocol.send(a, message)
    assert protocol.recv(b) == message
    a.close()
    assert protocol.recv(b) is None


def test_frame_layout_is_length_prefixed_json() -> None:
    frame = protocol.encode({"a": 1})
    (length,) = struct.unpack(">I", frame[:4])
    assert frame[4:] == b'{"a":1}' and length == 7


def test_large_frame_split_across_reads() -> None:
    a, b = _pair()
    big = {"blob": "x" * 3_000_000}
    import threading

    sender = threading.Thread(target=protocol.send, args=(a, big))
    sender.start()
    assert protocol.recv(b) == big
    sender.join(10)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (struct.pack(">I", 5) + b"[1,2]", "not a JSON object"),
        (struct.pack(">I", 4) + b"\x80abc", "not JSON"),
        (struct.pack(">I", protocol.MAX_FRAME_BYTES + 1), "exceeds"),
        (struct.pack(">I", 10) + b"{}", "closed before|middle"),
        (b"\x00\x00", "middle of a frame"),
    ],
)
def test_malformed_frames_raise_protocol_error(raw: bytes, match: str) -> None:
    a, b = _pair()
    a.sendall(raw)
    a.close()
    with pytest.raises(protocol.ProtocolError, match=match):
        protocol.recv(b)


def test_no_pickles_non_json_values_become_strings() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    assert b'"opaque!"' in protocol.encode({"v": Opaque()})


def test_socket_paths_and_start_time() -> None:
    assert protocol.socket_path(12, 1000, pidns=77) == "/tmp/flight_profiler-1000/agent-77-12.sock"
    assert protocol.socket_path(12, 0, "/proc/99/root").startswith("/proc/99/root/tmp/")
    assert protocol.log_path(12, 1000, pidns=77).endswith("agent-77-12.log")
    start = protocol.process_start_time(os.getpid())
    assert isinstance(start, int) and start > 0
    assert protocol.process_start_time(os.getpid()) == start


def test_pid_namespace_twins_get_distinct_socket_names() -> None:
    # two containers sharing /tmp, each running its workload as pid 1
    assert protocol.socket_name(1, 4026532001) != protocol.socket_name(1, 4026532002)
    own = protocol.pid_namespace()
    assert own > 0 and protocol.pid_namespace(os.getpid()) == own
    assert protocol.socket_name(os.getpid()) == f"agent-{own}-{os.getpid()}.sock"
