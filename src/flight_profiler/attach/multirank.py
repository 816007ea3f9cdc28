"""Run one request on several ranks at once: attach to each in parallel, results keyed by rank.

Each rank gets its own thread, its own attach (``flight_profiler.api.connect``) and its own
connection, so the job's latency is that of its slowest rank, not the sum. One rank failing
(dead, not attachable, command error) does not stop the others: its result carries the error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flight_profiler.agent import protocol
from flight_profiler.attach import process
from flight_profiler.attach.ranks import ProcInfo
from flight_profiler.errors import FlightProfilerError

if TYPE_CHECKING:
    from flight_profiler.api import Session

# Enough for the ranks of one node (8 GPUs, or 64 CPU ranks) without one thread per core.
MAX_PARALLEL = 64


@dataclass
class RankResult:
    rank: int | None
    pid: int
    ok: bool
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    seconds: float = 0.0
    injected: bool = False

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rank": self.rank, "pid": self.pid, "ok": self.ok,
                             "seconds": round(self.seconds, 3)}
        if self.ok:
            d["result"] = self.result
        else:
            d["error"] = self.error
        return d


def _one(target: ProcInfo, work: Callable[[Session], dict[str, Any]], timeout: float,
         method: str, on_done: Callable[[ProcInfo, RankResult], None] | None = None) -> RankResult:
    result = _attempt(target, work, timeout, method)
    if on_done is not None:
        on_done(target, result)
    return result


def _attempt(target: ProcInfo, work: Callable[[Session], dict[str, Any]], timeout: float,
             method: str) -> RankResult:
    from flight_profiler.api import connect

    started = time.monotonic()
    try:
        session = connect(target.pid, timeout=timeout, method=method)
        try:
            result = work(session)
        finally:
            session.close()
        return RankResult(target.rank, target.pid, True, result,
                          seconds=time.monotonic() - started, injected=session.injected)
    except FlightProfilerError as exc:
        return RankResult(target.rank, target.pid, False, error=exc.to_dict(),
                          seconds=time.monotonic() - started)
    except Exception as exc:
        # a bug of ours on one rank must not lose the others' results: reported as that rank's
        unexpected = FlightProfilerError(f"{type(exc).__name__}: {exc}",
                                         "a bug in flight_profiler: please report it with this line")
        return RankResult(target.rank, target.pid, False, error=unexpected.to_dict(),
                          seconds=time.monotonic() - started)


def has_agent(pid: int) -> bool:
    """An agent's socket exists for ``pid``: connecting will not inject (the agent removes its
    socket when it stops)."""
    try:
        target = process.inspect(pid, check_permissions=False)
    except FlightProfilerError:
        return False
    return os.path.exists(protocol.socket_path(target.ns_pid, target.home, target.root))


def detach_ranks(targets: list[ProcInfo], timeout: float = 10.0) -> list[RankResult]:
    """Detach the agents of the ranks that have one; the others are left untouched (connecting
    to them would inject an agent only to stop it)."""
    with_agent = [t for t in targets if has_agent(t.pid)]
    done = run_on_ranks(with_agent, lambda s: s.detach(), timeout)
    untouched = [RankResult(t.rank, t.pid, True, {"detached": False, "reason": "no agent"})
                 for t in targets if t not in with_agent]
    return sorted(done + untouched, key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.pid))


def run_on_ranks(targets: list[ProcInfo], work: Callable[[Session], dict[str, Any]],
                 timeout: float = 10.0, method: str = "auto",
                 on_done: Callable[[ProcInfo, RankResult], None] | None = None) -> list[RankResult]:
    """Attach to every target in parallel and run ``work(session)`` on each; ordered by rank.
    ``on_done(target, result)`` is called in the worker as each rank finishes, failed or not."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(len(targets), MAX_PARALLEL),
                            thread_name_prefix="fp-rank") as pool:
        futures = [pool.submit(_one, t, work, timeout, method, on_done) for t in targets]
        results = [f.result() for f in futures]
    results.sort(key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.pid))
    return results


def request_on_ranks(targets: list[ProcInfo], cmd: str, args: dict[str, Any],
                     timeout: float = 10.0, method: str = "auto") -> list[RankResult]:
    """The same agent request (handler name + JSON args) on every target."""
    def work(session: Session) -> dict[str, Any]:
        return session.request(cmd, args)

    return run_on_ranks(targets, work, timeout, method)


def to_document(results: list[RankResult], cmd: str) -> dict[str, Any]:
    """The ``--json`` document: one result per rank, keyed by rank (pid when rankless)."""
    return {"command": cmd,
            "ranks": {str(r.rank if r.rank is not None else f"pid{r.pid}"): r.to_dict()
                      for r in results},
            "failed": [r.rank for r in results if not r.ok]}
