"""``diagnose PID ... --arm "hang 600,nan,slow 3"``: after the first pass, leave triggers in the
job (docs/arm.md) whose evidence goes under the diagnosis' own directory (``<out>/armed``).

The list is read before the target is touched: each comma-separated item is what follows
``arm --on`` (options included: ``oom --rss-limit 12G``, ``slow 3 --steps 5``) and goes through
the `arm` command's own grammar, so a typo is one line and exit 2. ``--out`` is diagnose's, not
the item's. Triggers live in the agent: a diagnosis that arms leaves the agent in the job
(it would otherwise detach the agent it injected, and detach disarms).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from flight_profiler.errors import FlightProfilerError, UsageError

if TYPE_CHECKING:
    from flight_profiler.api import Session
    from flight_profiler.attach.multirank import RankResult
    from flight_profiler.attach.ranks import ProcInfo
    from flight_profiler.diagnose.driver import Driver
    from flight_profiler.requests import AgentRequest

ARMED_DIR = "armed"
_MAX_ITEMS = 8


def parse_arm_list(text: str, out_dir: str) -> list[AgentRequest]:
    """The `arm` requests of ``--arm``; UsageError naming the item that is wrong."""
    from flight_profiler.requests import parse

    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"--arm {text!r}: an empty item", 'e.g. --arm "hang 600,nan,slow 3"')
    if len(items) > _MAX_ITEMS:
        raise UsageError(f"--arm: {len(items)} triggers (at most {_MAX_ITEMS})", "")
    out = os.path.join(os.path.abspath(out_dir), ARMED_DIR)
    requests = []
    for item in items:
        if "--out" in item.split():
            raise UsageError(f"--arm {item!r}: the evidence goes to {out}", "leave --out out of --arm")
        try:
            requests.append(parse(f"arm --on {item} --out {out}"))
        except UsageError as exc:
            raise UsageError(f"--arm {item!r}: {exc.message}", 'e.g. --arm "hang 600,nan,slow 3"') from None
    return requests


def arm_all(driver: Driver, requests: list[AgentRequest]) -> list[dict[str, Any]]:
    """Send each `arm`; one outcome per trigger: {"kind", "line", "armed", "error", "out"}."""
    outcomes = []
    for request in requests:
        doc: dict[str, Any] = {"kind": request.args.get("on"), "line": request.line,
                               "out": request.args.get("out"), "armed": False, "error": None}
        try:
            answer = driver.run(request, timeout=30.0)
            doc["armed"] = bool(answer.get("armed"))
            doc["notes"] = [str(n) for n in answer.get("notes") or []][:10]
        except FlightProfilerError as exc:
            doc["error"] = exc.message
        outcomes.append(doc)
    return outcomes


def arm_ranks(targets: list[ProcInfo], requests: list[AgentRequest],
              timeout: float) -> list[RankResult]:
    """``diagnose --all-ranks --arm``: the same triggers on every rank, attached in parallel
    (each rank's evidence goes into the one directory, named ``...-rankR-N``). A rank's result
    is its outcomes as :func:`arm_all` gives them; a rank that cannot be reached is a failed
    result (its triggers are not armed)."""
    from flight_profiler.attach.multirank import run_on_ranks
    from flight_profiler.diagnose.driver import SessionDriver

    def work(session: Session) -> dict[str, Any]:
        return {"armed": arm_all(SessionDriver(session, connect_timeout=timeout), requests)}

    return run_on_ranks(targets, work, timeout)


def rank_armed(result: RankResult) -> bool:
    """Every trigger asked for is armed in this rank."""
    return result.ok and result.result is not None and all(a["armed"] for a in result.result["armed"])


def rank_keeps_agent(result: RankResult) -> bool:
    """Some trigger is armed in this rank: its agent must stay (detach would disarm)."""
    return result.ok and result.result is not None and any(a["armed"] for a in result.result["armed"])
