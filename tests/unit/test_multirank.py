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


def test_profiles_start_together_and_a_failed_rank_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """diagnose --all-ranks aligns the ranks' profile windows: the job rules compare shares of
    those windows, which mean nothing across different moments of a loaded host (CI once saw
    a healthy rank called a straggler because its window fell on the other rank's census)."""
    from flight_profiler.diagnose.all_ranks import ProfileAlignment

    align = ProfileAlignment(4, timeout=5.0)
    started: dict[int, float] = {}
    notes: dict[int, str] = {}

    def work(session: FakeSession) -> dict[str, Any]:
        rank = session.pid - 1000
        time.sleep(0.1 * rank)  # the phases before the profile take different times per rank
        notes[rank] = align.wait()
        started[rank] = time.monotonic()
        return {}

    def connect(pid: int, timeout: float = 10.0, method: str = "auto") -> FakeSession:
        if pid == 1003:  # never attaches: the others must not wait for it until the timeout
            time.sleep(0.4)
            raise AttachTimeout("the agent did not come up in process 1003 in time", "retry")
        return FakeSession(pid)

    monkeypatch.setattr("flight_profiler.api.connect", connect)
    t0 = time.monotonic()
    results = multirank.run_on_ranks(_targets(4), work, on_done=lambda t, r: align.leave())
    assert [r.ok for r in results] == [True, True, True, False]
    assert max(started.values()) - min(started.values()) < 0.05
    assert min(started.values()) - t0 >= 0.35  # released when rank 3 gave up, not before
    assert max(started.values()) - t0 < 2.0  # and not at the 5 s timeout
    assert all(n.startswith("aligned: 3 of 4") for n in notes.values()), notes


def test_alignment_gives_up_after_its_timeout_and_says_so() -> None:
    from flight_profiler.diagnose.all_ranks import ProfileAlignment

    align = ProfileAlignment(2, timeout=0.2)
    t0 = time.monotonic()
    note = align.wait()  # the other rank is busy elsewhere and never arrives nor leaves
    assert 0.15 < time.monotonic() - t0 < 2.0
    assert note.startswith("not aligned: 1 rank(s) did not reach their profile within 0.2s")
    assert align.wait().startswith("not aligned: the other ranks had given up")  # nor held again
    assert ProfileAlignment(1, 1.0).wait() == "not aligned: one rank"


def test_ranks_take_turns_for_the_commands_that_hold_their_threads() -> None:
    """A rank held by its thread gate makes the others wait for it in their collectives, where
    their own gate cannot hold them: diagnose --all-ranks runs those commands one rank at a time
    (the others' census failed with "stayed inside one native call in _engine_run_backward()")."""
    from flight_profiler.diagnose.all_ranks import TakeTurns
    from flight_profiler.requests import basic
    from flight_profiler.requests import torch as torch_requests

    inside: dict[str, int] = {"holding": 0, "most": 0, "other": 0, "most_other": 0}
    lock = threading.Lock()

    class Driver:
        injected = True

        def run(self, request: Any, on_event: Any = None, timeout: float | None = None) -> dict[str, Any]:
            kind = "other" if request.cmd == "status" or request.args.get("mode") == "record" else "holding"
            with lock:
                inside[kind] += 1
                inside[f"most{'_other' if kind == 'other' else ''}"] = max(
                    inside[f"most{'_other' if kind == 'other' else ''}"], inside[kind])
            time.sleep(0.05)
            with lock:
                inside[kind] -= 1
            return {}

    turn = threading.Lock()
    drivers = [TakeTurns(Driver(), turn) for _ in range(4)]
    requests = [torch_requests.tensors(), torch_requests.memory(snapshot=True, file="/tmp/s.pickle"),
                torch_requests.memory(), torch_requests.grads(),
                basic.status(), torch_requests.memory(["__main__", "step"], record=True)]
    threads = [threading.Thread(target=d.run, args=(r,)) for d in drivers for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inside["most"] == 1  # never two ranks holding their threads at once
    assert inside["most_other"] > 1  # the rest runs in parallel
    assert all(d.injected for d in drivers)
