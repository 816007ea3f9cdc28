"""A fake agent that stalls cannot hold root's CLI: every command ends by its deadline.

The fake (tests/fake_agent.py) is the target process itself, serving the real socket path with
the real protocol: a hello then silence, a hello one byte a second, a frame header then nothing,
a frame trickled a byte at a time. Each test runs the CLI (or the API) against it and checks
that it ends within the documented bound (docs/commands.md, "Deadlines and limits") with one
clear line and its exit code; on the code before this change each of them hung (the test's own
limit killed the CLI).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest

from fake_agent import FakeAgent, run_cli
from flight_profiler.agent import protocol
from flight_profiler.client import AgentClient, RequestTimeout
from flight_profiler.client_frames import AnswerLimits, FrameTimeout
from flight_profiler.errors import ExitCode
from flight_profiler.requests import basic, deadlines

SILENT = {"requests": [[{"silence": True}]]}
CANCEL_GRACE = 3.0
STARTUP = 10.0  # the CLI's own start and attach on a loaded 2-core machine (load 30+ seen)


def _one_error_line(stderr: str, text: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: ") and text in lines[0], stderr
    assert "Traceback" not in stderr


def test_status_against_a_silent_agent_ends_by_its_default_deadline() -> None:
    # GIVEN an agent that says hello and then nothing (a stuck target, or a fake)
    with FakeAgent(SILENT) as fake:
        # WHEN a one-shot status runs with no deadline given
        run = run_cli(str(fake.pid), "--cmd", "status", limit=90)
        # THEN it ends by status's default (30 s margin) plus the cancel grace, saying so
        bound = deadlines.QUICK_MARGIN_S + CANCEL_GRACE + STARTUP
        assert run.returncode == ExitCode.AGENT_TIMEOUT, run
        assert deadlines.QUICK_MARGIN_S <= run.seconds <= bound, run
        _one_error_line(run.stderr, "no answer within 30s (connection dropped)")
        # and the agent was asked to cancel before the connection was dropped
        assert [m["type"] for m in fake.received()][-1] == "cancel"


@pytest.mark.parametrize("answer", [
    [{"header_only": 200}, {"silence": True}],  # a frame header, then nothing
    [{"trickle": {"result": {"pid": 1}}, "rate": 1}],  # a result, one byte a second
    [{"event": {"tick": 1}}, {"silence": True}],  # an event of a command that streams none
], ids=["header-then-nothing", "one-byte-a-second", "stray-event"])
def test_a_stalled_answer_ends_at_the_deadline_given(answer: list[dict[str, object]]) -> None:
    with FakeAgent({"requests": [answer]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "stack", "--deadline", "2", limit=60)
    assert run.returncode in (ExitCode.AGENT_TIMEOUT, ExitCode.BAD_ANSWER), run
    assert run.seconds <= 2 + CANCEL_GRACE + STARTUP, run
    assert "Traceback" not in run.stderr and run.stderr.startswith("error: "), run


def test_at_the_deadline_what_the_agent_had_is_shown_then_exit_13() -> None:
    # GIVEN an agent that works slowly but answers a cancel with what it has
    stack = {"threads": [{"name": "MainThread", "main": True,
                          "frames": [{"file": "train.py", "line": 7, "function": "step"}]}]}
    with FakeAgent({"requests": [[{"until_cancel": True}, {"result": stack}]]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "stack", "--deadline", "1", limit=60)
    assert run.returncode == ExitCode.AGENT_TIMEOUT, run
    assert 'File "train.py", line 7, in step' in run.stdout, run  # the partial answer, shown
    _one_error_line(run.stderr, "cancelled after 1s")


def test_a_hello_trickled_byte_by_byte_is_an_attach_timeout() -> None:
    # GIVEN an agent whose hello comes one byte a second (each read returns in time)
    with FakeAgent({"handshake": [{"trickle": {"hello": {}}, "rate": 1}]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", "--timeout", "2", limit=60)
    # THEN the handshake's deadline is the whole handshake's, not one read's
    assert run.returncode == ExitCode.ATTACH_TIMEOUT, run
    assert run.seconds <= 2 + STARTUP, run
    _one_error_line(run.stderr, "did not answer within 2.0s")


def test_ctrl_c_during_a_trickled_frame_ends_within_the_grace() -> None:
    # GIVEN a watch whose agent trickles its first event for ever
    spec = {"requests": [[{"trickle": {"event": {"type": "watching", "target": "m.f"}}, "rate": 2}]]}
    with FakeAgent(spec) as fake:
        # WHEN the user presses Ctrl-C half a second after the request went out
        run = run_cli(str(fake.pid), "--cmd", "watch m f", limit=60,
                      interrupt_when=lambda: any(m["type"] == "request" for m in fake.received()))
        received = fake.received()
    # THEN the CLI sends cancel and leaves within the grace, whatever the agent does, saying
    # that the agent did not confirm it (its hooks cannot be known to be gone)
    assert run.returncode == ExitCode.AGENT_TIMEOUT, run
    assert run.seconds <= 0.5 + CANCEL_GRACE + STARTUP, run
    assert received[-1]["type"] == "cancel"
    assert "interrupted: cancelling" in run.stderr
    _one_error_line(run.stderr.split("\n", 1)[1], "the agent did not answer within 3s")


def test_the_shell_says_so_in_one_line_and_ends_when_the_agent_stops_answering() -> None:
    with FakeAgent(SILENT) as fake:
        run = run_cli(str(fake.pid), "--deadline", "1", stdin="status\nstack\nquit\n", limit=60)
        sent = [m.get("cmd") for m in fake.received() if m["type"] == "request"]
    assert run.seconds <= 1 + CANCEL_GRACE + STARTUP, run
    # the connection was dropped: the shell does not go on to `stack` on a closed session
    assert run.stderr.strip().splitlines() == [
        "error: no answer within 1s (connection dropped) (hint: a thread of the target may hold "
        "the GIL in a long native call, or what answers is not a working agent; retry later, or "
        "give it more time with --deadline)"], run
    assert sent == ["status"]


def _rank_env(rank: int, run_id: str) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": run_id, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


def test_all_ranks_ends_when_every_rank_stalls() -> None:
    run_id = f"fp-hostile-{uuid.uuid4().hex[:8]}"
    with FakeAgent(SILENT, env=_rank_env(0, run_id)) as rank0, \
            FakeAgent(SILENT, env=_rank_env(1, run_id)):
        run = run_cli(str(rank0.pid), "--all-ranks", "--cmd", "status", "--deadline", "2",
                      limit=60)
    assert run.seconds <= 2 + CANCEL_GRACE + STARTUP, run
    assert run.returncode == ExitCode.COMMAND_FAILED, run  # "some ranks failed", each shown
    assert run.stdout.count("no answer within 2s") == 2, run
    assert "Traceback" not in run.stderr


def test_diagnose_goes_on_after_a_phase_whose_agent_stalls(tmp_path: object) -> None:
    # GIVEN an agent that stalls on its first request (status) and refuses the rest
    refuse = [{"error": {"kind": "failed", "message": "nothing here", "hint": ""}}]
    spec = {"requests": [[{"silence": True}], refuse]}
    with FakeAgent(spec) as fake:
        run = run_cli("diagnose", str(fake.pid), "--timeout", "0.5", "--out",
                      os.path.join(str(tmp_path), "out"), limit=150)
    # THEN the status phase times out at its deadline (0.5 s + the 15 s backstop + the
    # 5 s grace) and the diagnosis ends, incomplete, instead of hanging in that phase
    assert run.returncode == ExitCode.INCOMPLETE, run
    assert run.seconds <= 0.5 + 15 + 5 + 30, run
    assert "Traceback" not in run.stderr


# -- the client's own deadlines, in this process --------------------------------------------------
class _Server:
    """A socket served by a thread of this test: hello, then ``answer(conn)``."""

    def __init__(self, tmp_path: object, answer: object) -> None:
        self.path = os.path.join(str(tmp_path), "a.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        try:
            protocol.recv(conn)
            protocol.send(conn, {"type": "hello", "protocol": protocol.PROTOCOL_VERSION,
                                 "pid": os.getpid(), "start_time": 7})
            protocol.recv(conn)  # the request
            self.answer(conn)  # type: ignore[operator]
        except OSError:
            pass  # the client hung up

    def client(self, limits: AnswerLimits) -> AgentClient:
        return AgentClient.connect(self.path, os.getpid(), 7, timeout=5, limits=limits)


def test_a_frame_that_begins_must_end_within_frame_seconds(tmp_path: object) -> None:
    # GIVEN a stream with no deadline of its own, whose agent begins a frame and stops
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"\x00\x00\x00\x40{\"type\":\"event\"")
        time.sleep(30)

    client = _Server(tmp_path, answer).client(AnswerLimits(frame_seconds=1.0))
    started = time.monotonic()
    with pytest.raises(FrameTimeout, match="sent only 15 of 64 bytes of it in 1s"):
        client.execute("watch", {}, timeout=None)
    # THEN the frame's own deadline ends it, and the connection is dropped (out of step)
    assert time.monotonic() - started < 5 and client.closed


def test_the_api_cancels_at_its_deadline_and_drops_a_silent_connection(tmp_path: object) -> None:
    def answer(conn: socket.socket) -> None:
        time.sleep(30)

    client = _Server(tmp_path, answer).client(AnswerLimits())
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as stopped:
        client.execute("status", {}, timeout=0.5, grace=0.5)
    assert stopped.value.dropped and stopped.value.exit_code == ExitCode.AGENT_TIMEOUT
    assert time.monotonic() - started < 3 and client.closed


def test_every_request_has_a_deadline_unless_it_streams_until_stopped() -> None:
    from flight_profiler.requests import hooks
    from flight_profiler.requests import torch as torch_requests

    assert deadlines.deadline(basic.status()) == deadlines.QUICK_MARGIN_S
    assert deadlines.deadline(basic.dataloader(sample=3)) == 3 + deadlines.WORK_MARGIN_S
    assert deadlines.deadline(torch_requests.profile(duration=5)) == 5 + deadlines.WORK_MARGIN_S
    assert deadlines.deadline(hooks.watch(["m", "f"], timeout=7)) == 7 + deadlines.QUICK_MARGIN_S
    # a watch with no --timeout runs until Ctrl-C (or --deadline)
    assert deadlines.deadline(hooks.watch(["m", "f"], count=3)) is None
