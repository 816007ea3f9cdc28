"""Session.execute, the one way a request runs (CLI, shell, diagnose, API), against a real agent
server in this process: Ctrl-C and a deadline both cancel, drain, and hand back the final answer."""

from __future__ import annotations

import os
from typing import Any

import pytest
from test_server import REMOVED, _client, _hooks, agent  # noqa: F401  (the fixture)

from flight_profiler.api import Session
from flight_profiler.client import RequestInterrupted, RequestTimeout
from flight_profiler.errors import AgentLost, RemoteCommandError
from flight_profiler.requests import AgentRequest, basic


def _session(path: str) -> Session:
    return Session(os.getpid(), _client(path), injected=False, attach_seconds=0.0)


def test_ctrl_c_cancels_drains_and_hands_back_the_final_result(agent: str) -> None:  # noqa: F811
    # GIVEN a stream that a user stops with Ctrl-C on its third event
    seen: list[int] = []
    cancelled: list[int] = []

    def on_event(data: dict[str, Any]) -> None:
        seen.append(data["tick"])
        if len(seen) == 3:
            raise KeyboardInterrupt

    session = _session(agent)
    # WHEN it runs
    with pytest.raises(RequestInterrupted) as stopped:
        session.execute(AgentRequest("t_stream"), on_event,
                        on_cancel=lambda: cancelled.append(len(seen)))
    # THEN it is cancelled once, the hooks are gone, and the final answer is kept
    assert cancelled == [3] and seen == [1, 2, 3]
    assert isinstance(stopped.value, KeyboardInterrupt)
    assert stopped.value.result is not None and stopped.value.result["cancelled"] is True
    assert stopped.value.error is None
    assert REMOVED == ["hook"] and _hooks(agent) == []
    assert session.execute(basic.status())["pid"] == os.getpid()  # same connection still works


def test_the_deadline_cancels_and_the_partial_result_comes_back(agent: str) -> None:  # noqa: F811
    session = _session(agent)
    events: list[dict[str, Any]] = []
    with pytest.raises(RequestTimeout) as exc:
        session.execute(AgentRequest("t_stream"), events.append, timeout=0.2)
    assert exc.value.partial is not None and exc.value.partial["cancelled"] is True
    assert exc.value.events == len(events) >= 1 and not exc.value.dropped
    assert REMOVED == ["hook"]
    assert session.client is not None  # a clean cancel keeps the connection


def test_a_result_within_the_deadline_is_just_returned(agent: str) -> None:  # noqa: F811
    session = _session(agent)
    assert session.execute(AgentRequest("t_stream", {"limit": 2}), timeout=30) == \
        {"ticks": 2, "cancelled": False}


def test_remote_errors_raise_and_detach_closes_the_session(agent: str) -> None:  # noqa: F811
    session = _session(agent)
    with pytest.raises(RemoteCommandError, match="no such method f"):
        session.execute(AgentRequest("t_fail"))
    assert session.client is not None  # an error answer is not a lost connection
    assert session.run("stack --limit 3")["threads"]  # the API parses command lines the same way
    session.execute(basic.detach())
    assert session.client is None


def test_stream_takes_a_built_request_and_leaving_early_cancels(agent: str) -> None:  # noqa: F811
    session = _session(agent)
    ticks = []
    for event in session.stream(AgentRequest("t_stream", {"limit": 1000})):
        ticks.append(event["tick"])
        if len(ticks) == 2:
            break
    assert ticks == [1, 2]
    assert session.last_result is not None and session.last_result["cancelled"] is True
    assert REMOVED == ["hook"]


class _LostClient:
    """A connection whose agent went away mid-request (its process died)."""

    closed = True

    def __init__(self) -> None:
        self.hello: dict[str, Any] = {}

    def execute(self, *args: Any) -> dict[str, Any]:
        raise AgentLost("the agent closed the connection (did the target exit?)")

    def close(self) -> None:
        pass


def test_a_lost_agent_says_what_the_dead_target_wrote_while_its_stderr_was_held() -> None:
    # GIVEN a session whose target died while the agent held its stderr (attach/last_words.py)
    words = "it exited while the agent held back its stderr (...); what it wrote last: boom"
    session = Session(os.getpid(), _LostClient(), injected=False,  # type: ignore[arg-type]
                      attach_seconds=0.0, last_words=lambda: words)
    # WHEN a request loses the connection
    with pytest.raises(AgentLost) as lost:
        session.execute(basic.status())
    # THEN the error says both, and the session is closed
    assert lost.value.message.endswith(words) and "closed the connection" in lost.value.message
    assert session.client is None
    # AND with nothing held the error is the plain one
    session = Session(os.getpid(), _LostClient(), injected=False,  # type: ignore[arg-type]
                      attach_seconds=0.0, last_words=lambda: None)
    with pytest.raises(AgentLost) as lost:
        session.execute(basic.status())
    assert lost.value.message == "the agent closed the connection (did the target exit?)"
