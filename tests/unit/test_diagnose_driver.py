"""SessionDriver: the deadline cancels the request (the agent then removes its hooks), a
dropped connection becomes a timeout, and Ctrl-C cancels before it propagates."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flight_profiler.diagnose import driver as driver_mod
from flight_profiler.diagnose.driver import PhaseTimeout, SessionDriver
from flight_profiler.errors import AgentLost


class FakeClient:
    """Streams one event, then waits for a cancel (or the end of `answer_after`)."""

    def __init__(self, answer_after: float | None = None, answer_cancel: bool = True,
                 interrupt: bool = False) -> None:
        self.cancelled = threading.Event()
        self.closed = threading.Event()
        self.answer_after = answer_after
        self.answer_cancel = answer_cancel
        self.interrupt = interrupt
        self.started: list[tuple[str, dict[str, Any]]] = []
        self.drained = False

    def start(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        self.started.append((cmd, args or {}))
        return 7

    def messages(self, req_id: int) -> Iterator[tuple[str, dict[str, Any]]]:
        yield "event", {"type": "call", "n": 1, "cost_ms": 1.0}
        if self.interrupt:
            raise KeyboardInterrupt
        deadline = time.monotonic() + (self.answer_after if self.answer_after is not None else 30)
        while time.monotonic() < deadline:
            if self.closed.is_set():
                raise AgentLost("lost the connection to the agent")
            if self.cancelled.is_set() and self.answer_cancel:
                yield "result", {"reason": "cancelled", "matched": 1}
                return
            time.sleep(0.01)
        yield "result", {"reason": "count", "matched": 3}

    def cancel(self, req_id: int) -> None:
        assert req_id == 7
        self.cancelled.set()

    def drain(self, req_id: int, timeout: float = 3.0) -> dict[str, Any]:
        self.drained = True
        return {}

    def close(self) -> None:
        self.closed.set()


class FakeSession:
    def __init__(self, client: FakeClient) -> None:
        self.client: FakeClient | None = client
        self.pid = 1

    def _client(self) -> FakeClient:
        assert self.client is not None
        return self.client

    def close(self) -> None:
        self.client = None


def test_result_before_the_deadline_is_returned_with_events() -> None:
    client = FakeClient(answer_after=0.05)
    events: list[dict[str, Any]] = []
    result = SessionDriver(FakeSession(client)).run(  # type: ignore[arg-type]
        "watch __main__ train_step -n 3", events.append, timeout=5)
    assert result == {"reason": "count", "matched": 3}
    assert events == [{"type": "call", "n": 1, "cost_ms": 1.0}]
    assert client.started[0][0] == "watch"
    assert client.started[0][1]["target"]["method"] == "train_step"
    assert not client.cancelled.is_set()


def test_deadline_cancels_and_keeps_the_partial_result() -> None:
    client = FakeClient()
    started = time.monotonic()
    with pytest.raises(PhaseTimeout) as exc:
        SessionDriver(FakeSession(client)).run("watch __main__ train_step -n 3", None,  # type: ignore[arg-type]
                                               timeout=0.2)
    assert time.monotonic() - started < 3
    assert client.cancelled.is_set()
    assert exc.value.partial == {"reason": "cancelled", "matched": 1}
    assert exc.value.events == 1


def test_an_agent_that_ignores_the_cancel_is_disconnected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "CANCEL_GRACE_S", 0.2)
    client = FakeClient(answer_cancel=False)
    session = FakeSession(client)
    with pytest.raises(PhaseTimeout, match="connection dropped"):
        SessionDriver(session).run("watch __main__ train_step -n 3", None, timeout=0.1)  # type: ignore[arg-type]
    assert client.closed.is_set()
    assert session.client is None  # the next phase reconnects


def test_ctrl_c_cancels_the_request_before_propagating() -> None:
    client = FakeClient(interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        SessionDriver(FakeSession(client)).run("trace __main__ train_step", None, timeout=5)  # type: ignore[arg-type]
    assert client.cancelled.is_set() and client.drained
