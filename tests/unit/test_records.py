"""records.py's classes behave as the dataclasses they replaced (issue 23: ``dataclasses`` was
a tenth of a later command's start-up): the same repr, equality by fields and class, frozen
where they were frozen, and copies that keep their fields."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from flight_profiler.attach.process import Status, TargetInfo
from flight_profiler.cli.agent_commands.base import Rendering, render_json
from flight_profiler.client_frames import LIMITS, AnswerLimits
from flight_profiler.requests import basic
from flight_profiler.requests.base import AgentRequest


@dataclasses.dataclass(frozen=True)
class AgentRequestAsItWas:  # requests/base.py before issue 23
    cmd: str
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    line: str = ""


def test_a_request_reads_compares_and_refuses_changes_as_the_frozen_dataclass_did() -> None:
    req = basic.stack(show_all=True)
    was = AgentRequestAsItWas(req.cmd, req.args, req.line)
    assert repr(req) == repr(was).replace("AgentRequestAsItWas", "AgentRequest")
    assert req == AgentRequest("stack", {"all": True, "limit": 200}, "stack --all")
    assert req != AgentRequest("stack", {"all": True, "limit": 200}, "stack")
    assert req != was  # another class, as a dataclass compares
    assert AgentRequest("status") == AgentRequest("status", {}, "")
    assert AgentRequest("a").args is not AgentRequest("a").args  # a fresh dict each, no sharing
    with pytest.raises(AttributeError):
        req.cmd = "status"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del req.line
    with pytest.raises(TypeError):  # its args are a dict: unhashable, as the dataclass was
        hash(req)
    for again in (copy.copy(req), copy.deepcopy(req), pickle.loads(pickle.dumps(req))):
        assert again == req and again is not req


def test_answer_limits_are_frozen_with_their_defaults() -> None:
    assert AnswerLimits() == LIMITS and AnswerLimits(frame_seconds=1.0) != LIMITS
    assert AnswerLimits(frame_seconds=1.0).frame_seconds == 1.0
    assert AnswerLimits().cap("event") == 8 << 20 and AnswerLimits().cap("hello") == 64 << 10
    assert hash(AnswerLimits()) == hash(LIMITS)  # all fields hashable: usable as a key
    assert repr(LIMITS).startswith("AnswerLimits(result_bytes=33554432, event_bytes=")
    with pytest.raises(AttributeError):
        LIMITS.result_bytes = 1  # type: ignore[misc]


def test_mutable_records_compare_by_fields_and_are_unhashable() -> None:
    one = TargetInfo(1, 0, "S", 0, 1, 5, "/usr/bin/python3", (3, 11), None, "/")
    two = copy.copy(one)
    assert one == two and one.cmdline == [] and one.environ == {} and one.uids == ()
    two.start_time += 1  # what tests/unit/test_identity.py does to stand for a reused pid
    assert one != two and one.start_time == 5
    assert one.cmdline is not TargetInfo(1, 0, "S", 0, 1, 5, "x", None, None, "/").cmdline
    with pytest.raises(TypeError):
        hash(one)
    assert repr(Status("S", 0, (0, 0, 0, 0), 7, 0)) == (
        "Status(state='S', tracer_pid=0, uids=(0, 0, 0, 0), ns_pid=7, cap_eff=0, tgid=0, cap_prm=0)")
    assert Rendering() == Rendering(render_json, None) != Rendering(render_json, render_json)
