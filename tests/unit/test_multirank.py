"""The multi-rank runner with a fake attach: parallel, keyed by rank, one failure isolated."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from flight_profiler.attach import multirank
from flight_profiler.attach.ranks import ProcInfo
from flight_profiler.errors import AttachTimeout


class FakeSession:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.injected = True
        self.closed = False

    def request(self, cmd: str, args: dict[str, Any] | None = None, on_event: Any = None) -> dict[str, Any]:
        return {"cmd": cmd, "pid": self.pid}

    def close(self) -> None:
        self.closed = True


def _targets(n: int) -> list[ProcInfo]:
    return [ProcInfo(pid=1000 + r, ppid=1, user="u", cmdline=["python"], python="3.11",
                     torch=True, rank=r) for r in reversed(range(n))]


def test_ranks_attach_in_parallel_and_results_are_keyed_by_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    inside = 0
    most = 0
    lock = threading.Lock()
    sessions: list[FakeSession] = []

    def connect(pid: int, timeout: float = 10.0, method: str = "auto") -> FakeSession:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.2)  # an attach that waits (gdb, the agent starting)
        with lock:
            inside -= 1
        if pid == 1002:
            raise AttachTimeout("the agent did not come up in process 1002 in time", "retry")
        s = FakeSession(pid)
        sessions.append(s)
        return s

    monkeypatch.setattr("flight_profiler.api.connect", connect)
    started = time.monotonic()
    results = multirank.request_on_ranks(_targets(4), "stack", {})
    elapsed = time.monotonic() - started
    assert most == 4 and elapsed < 0.6  # 4 x 0.2 s in sequence would be 0.8 s
    assert [r.rank for r in results] == [0, 1, 2, 3]
    assert [r.ok for r in results] == [True, True, False, True]
    assert results[2].error is not None and results[2].error["kind"] == "attach_timeout"
    assert all(s.closed for s in sessions)
    doc = multirank.to_document(results, "stack")
    assert doc["ranks"]["3"]["pid"] == 1003 and doc["ranks"]["3"]["result"]["cmd"] == "stack"
    assert doc["failed"] == [2]


def test_detach_touches_only_ranks_with_an_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    connected: list[int] = []

    def connect(pid: int, timeout: float = 10.0, method: str = "auto") -> FakeSession:
        connected.append(pid)
        s = FakeSession(pid)
        s.detach = lambda: {"detached": True}  # type: ignore[attr-defined]
        return s

    monkeypatch.setattr("flight_profiler.api.connect", connect)
    monkeypatch.setattr(multirank, "has_agent", lambda pid: pid == 1001)
    results = multirank.detach_ranks(_targets(3))
    assert connected == [1001]  # no agent injected into ranks 0 and 2 just to stop it
    assert [r.result for r in results] == [{"detached": False, "reason": "no agent"},
                                           {"detached": True},
                                           {"detached": False, "reason": "no agent"}]
