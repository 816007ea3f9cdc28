"""SessionDriver over a real agent server in this process: the deadline cancels the request (the
agent removes its hooks), an agent that ignores the cancel is disconnected and the next phase
reconnects, and Ctrl-C cancels before it propagates."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from test_server import REMOVED, _client, _hooks, agent  # noqa: F401  (the fixture)

from flight_profiler.api import Session
from flight_profiler.diagnose import driver as driver_mod
from flight_profiler.diagnose.driver import PhaseTimeout, SessionDriver
from flight_profiler.requests import AgentRequest


def _session(path: str) -> Session:
    return Session(os.getpid(), _client(path), injected=False, attach_seconds=0.0)


def test_result_before_the_deadline_is_returned_with_events(agent: str) -> None:  # noqa: F811
    events: list[dict[str, Any]] = []
    result = SessionDriver(_session(agent)).run(AgentRequest("t_stream", {"limit": 3}), events.append,
                                                timeout=30)
    assert result == {"ticks": 3, "cancelled": False}
    assert [e["tick"] for e in events] == [1, 2, 3]


def test_deadline_cancels_and_keeps_the_partial_result(agent: str) -> None:  # noqa: F811
    started = time.monotonic()
    with pytest.raises(PhaseTimeout, match=r"cancelled after 0\.3s") as exc:
        SessionDriver(_session(agent)).run(AgentRequest("t_stream"), None, timeout=0.3)
    assert time.monotonic() - started < 10  # generous: a loaded machine
    assert exc.value.partial is not None and exc.value.partial["cancelled"] is True
    assert exc.value.events == exc.value.partial["ticks"] >= 1
    assert REMOVED == ["hook"] and _hooks(agent) == []


def _deaf(ctx: Any) -> dict[str, Any]:
    """A handler stuck in native code: it never looks at the cancel."""
    ctx.add_hook("deaf hook", lambda: REMOVED.append("deaf"))
    time.sleep(1.5)
    return {"done": True}


def test_an_agent_that_ignores_the_cancel_is_disconnected_and_the_next_run_reconnects(
        agent: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    import test_server

    monkeypatch.setitem(test_server.TEST_HANDLERS, "t_deaf", _deaf)
    monkeypatch.setattr(driver_mod, "CANCEL_GRACE_S", 0.2)
    session = _session(agent)
    driver = SessionDriver(session)
    with pytest.raises(PhaseTimeout, match="connection dropped") as exc:
        driver.run(AgentRequest("t_deaf"), None, timeout=0.1)
    assert exc.value.partial is None
    assert session.client is None  # closed: the next phase reconnects
    reconnected: list[int] = []

    def connect(pid: int, timeout: float = 10.0) -> Session:
        reconnected.append(pid)
        return _session(agent)

    monkeypatch.setattr("flight_profiler.api.connect", connect)
    deadline = time.monotonic() + 10
    while "deaf" not in REMOVED:  # the disconnect cancelled it once the handler returned
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert driver.run(AgentRequest("status"))["active_hooks"] == []
    assert reconnected == [os.getpid()]


def test_ctrl_c_cancels_the_request_before_propagating(agent: str) -> None:  # noqa: F811
    def on_event(data: dict[str, Any]) -> None:
        if data["tick"] == 2:
            raise KeyboardInterrupt

    session = _session(agent)
    with pytest.raises(KeyboardInterrupt):
        SessionDriver(session).run(AgentRequest("t_stream"), on_event, timeout=30)
    assert REMOVED == ["hook"]  # removed before control came back
    assert session.request("status")["active_hooks"] == []  # the connection still works
