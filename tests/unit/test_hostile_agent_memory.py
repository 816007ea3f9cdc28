"""What an agent's answer may cost the CLI: capped by the kind of frame and by its decoded size.

A 100 MB result frame took the CLI to 2.6 GB before this change (the 256 MB frame cap allowed
~6-7 GB). Now a frame is refused from its header when beyond its kind's cap (nothing buffered),
or from its bytes when it would decode to more than the CLI accepts; the worst frame that is
accepted still costs a bounded, measured peak (bench/bench_answer_memory.py quotes them).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import tracemalloc

import pytest
from test_server import agent  # noqa: F401  (the fixture: a real agent server in this process)

from fake_agent import FakeAgent, run_cli
from flight_profiler.agent import protocol
from flight_profiler.client import AgentClient
from flight_profiler.client_frames import LIMITS, AnswerLimits, FrameTooLarge, decoded_cost
from flight_profiler.errors import BadAnswer, ExitCode

MiB = 1 << 20


def test_a_100_mb_result_is_refused_without_being_buffered() -> None:
    with FakeAgent({"requests": [[{"big_result": 100_000_000, "shape": "dicts"}]]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", limit=120)
    assert run.returncode == ExitCode.BAD_ANSWER, run
    assert re.search(r"the agent's answer was too large: a frame of 99,99\d,\d{3} bytes \(the CLI "
                     r"accepts up to 33,554,432\)", run.stderr), run
    assert run.peak_rss < 64 * MiB, run  # the CLI's own size (~20 MiB): nothing of the frame kept
    assert "Traceback" not in run.stderr


def test_a_frame_that_would_decode_to_gigabytes_is_refused_before_decoding() -> None:
    # GIVEN 20 MB of empty objects: under the result cap, ~540 MB once decoded
    with FakeAgent({"requests": [[{"big_result": 20_000_000, "shape": "dicts"}]]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", limit=120)
    assert run.returncode == ExitCode.BAD_ANSWER, run
    assert "would take about" in run.stderr and "once decoded" in run.stderr, run
    assert run.peak_rss < 96 * MiB, run  # the frame's 20 MB of bytes, never its objects


def test_the_largest_frame_accepted_costs_a_bounded_peak() -> None:
    # GIVEN the largest frame of empty objects the CLI accepts (its decoded estimate at the cap)
    unit, head = b"{},", len(b'{"type":"result","id":1,"data":{"junk":[0]}}')
    count = (LIMITS.decoded_bytes - decoded_cost(b"")) // (decoded_cost(unit) - decoded_cost(b"")) - 100
    size = head + count * len(unit)
    with FakeAgent({"requests": [[{"big_result": size, "shape": "dicts"}]]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", limit=120)
    # THEN it is shown, and the CLI's peak stays within the decoded cap (plus the interpreter)
    assert run.returncode == 0, run
    assert run.peak_rss < LIMITS.decoded_bytes + 64 * MiB, run


@pytest.mark.parametrize("unit", [b"{},", b"[],", b'"ab",', b"7,", b"1.5,", b'{"a":1},', b"[[]],",
                                  b'{"k":[]},', b'"\\u00e9x",', b"12345678901234567890,",
                                  b'"\\ud83d\\ude00",', b"null,", b"-1e300,"],
                         ids=lambda u: u.decode())
def test_the_decoded_estimate_bounds_what_json_really_allocates(unit: bytes) -> None:
    body = b"[" + unit * (400_000 // len(unit)) + b"0]"
    tracemalloc.start()
    try:
        json.loads(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= decoded_cost(body), (peak, decoded_cost(body))


def test_non_ascii_text_is_counted_four_bytes_a_character() -> None:
    body = b'["' + b"a" * 400_000 + "\U0001f600".encode() + b'"]'
    tracemalloc.start()
    try:
        json.loads(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= decoded_cost(body)


def _serve_once(tmp: str, frames: list[bytes]) -> str:
    path = os.path.join(tmp, "a.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            protocol.recv(conn)
            protocol.send(conn, {"type": "hello", "protocol": protocol.PROTOCOL_VERSION,
                                 "pid": os.getpid(), "start_time": 7})
            protocol.recv(conn)
            for frame in frames:
                conn.sendall(frame)
            protocol.recv(conn)  # until the client leaves
        except OSError:
            pass  # the client hung up, as it should on a frame it refuses

    threading.Thread(target=serve, daemon=True).start()
    return path


def test_an_event_is_capped_below_a_result(tmp_path: object) -> None:
    # an event frame of 9 MB: under the result cap, over the event cap; its body is not read
    limits = AnswerLimits()
    header = (limits.event_bytes + 1).to_bytes(4, "big")
    path = _serve_once(str(tmp_path), [header + b'{"type":"event","id":1,"data":{}}'])
    client = AgentClient.connect(path, os.getpid(), 7, timeout=5, limits=limits)
    with pytest.raises(FrameTooLarge, match="a frame of kind event of 8,388,609 bytes"):
        client.execute("watch", {})
    assert client.closed  # out of step: the body was never read


def test_a_frame_whose_kind_is_not_first_gets_the_smallest_cap(tmp_path: object) -> None:
    body = json.dumps({"id": 1, "data": {"x": "y" * 100_000}, "type": "result"}).encode()
    path = _serve_once(str(tmp_path), [len(body).to_bytes(4, "big") + body])
    client = AgentClient.connect(path, os.getpid(), 7, timeout=5)
    with pytest.raises(FrameTooLarge, match="kind other"):
        client.execute("status", {})


def test_an_integer_of_a_thousand_digits_is_malformed(tmp_path: object) -> None:
    body = b'{"type":"result","id":1,"data":{"pid":' + b"9" * 1000 + b"}}"
    path = _serve_once(str(tmp_path), [len(body).to_bytes(4, "big") + body])
    client = AgentClient.connect(path, os.getpid(), 7, timeout=5)
    with pytest.raises(BadAnswer, match="malformed: an integer of 1000 digits"):
        client.execute("status", {})
    assert not client.closed  # the frame was read whole: the connection is still in step


def test_the_real_agents_frames_say_their_kind_first(agent: str) -> None:  # noqa: F811
    # The caps are chosen from a frame's first bytes: the agent's own frames must lead with
    # their type, as protocol.encode writes them (else a real result would get the 64 KiB cap).
    from flight_profiler.client_frames import _KINDS

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(agent)
    sock.settimeout(30)
    protocol.send(sock, {"type": "hello", "protocol": protocol.PROTOCOL_VERSION})
    protocol.recv(sock)
    seen = set()
    for cmd, args in (("t_stream", {"limit": 2}), ("t_fail", {})):
        protocol.send(sock, {"type": "request", "id": 1, "cmd": cmd, "args": args})
        while True:
            length = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
            body = sock.recv(length, socket.MSG_WAITALL)
            kind = json.loads(body)["type"]
            assert any(body.startswith(prefix) and kind == name for prefix, name in _KINDS), body
            seen.add(kind)
            if kind != "event":
                break
    sock.close()
    assert seen == {"event", "result", "error"}
