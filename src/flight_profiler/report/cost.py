"""What a performance finding costs: the share of step (or GPU) time its fix would recover.

Severity follows the cost, not the pattern (docs/report-rules.md, "Cost and severity"): a
synchronize call that waits on a saturated GPU is the healthy GPU-bound state and costs nothing;
the same call followed by an idle GPU costs exactly that idle time. Memory findings (leak, OOM,
fragmentation, retention) have no time cost and keep the severity their rule gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from flight_profiler.report.thresholds import T


class CostDict(TypedDict):
    """``cost`` of a finding in report.json (docs/report-schema.md)."""

    pct: float
    us: float
    of: str
    method: str


@dataclass(frozen=True)
class Cost:
    """An estimate: ``us`` microseconds, ``pct`` percent of ``of``; ``method`` says how.

    ``spread_pct``: how far the same measurement moves from step to step (two standard errors
    of the per-step shares), where the rule knows it: the margin near a threshold is at least
    that wide."""

    pct: float
    us: float
    of: str  # "step time" | "trace time" | "GPU time"
    method: str
    spread_pct: float = 0.0

    def to_dict(self) -> CostDict:
        return {"pct": round(self.pct, 3), "us": round(self.us, 3), "of": self.of,
                "method": self.method}


def cost_of(us: float, whole_us: float, of: str, method: str, spread_pct: float = 0.0) -> Cost:
    """``us`` out of ``whole_us`` (clamped to 0..100 %: estimates can overlap their whole)."""
    us = max(0.0, us)
    pct = min(100.0, 100.0 * us / whole_us) if whole_us > 0 else 0.0
    return Cost(pct=pct, us=us, of=of, method=method, spread_pct=max(0.0, spread_pct))


def severity_for(cost: Cost) -> str:
    """critical >= T.cost_critical_pct, warning >= T.cost_warning_pct, else info (the plain
    lines; :func:`judge` adds the margin around them)."""
    if cost.pct >= T.cost_critical_pct:
        return "critical"
    if cost.pct >= T.cost_warning_pct:
        return "warning"
    return "info"


def margin_of(line: float, cost: Cost) -> float:
    """Half-width of the borderline band around ``line``: a share of the line, or the
    measurement's own spread when it is wider."""
    return max(line * T.severity_margin, cost.spread_pct)


def judge(cost: Cost, warning_pct: float | None = None) -> tuple[str, str]:
    """(severity, borderline note) with a stated margin around each line.

    A cost within the margin of a line gets the severity below it and a note saying so: two
    runs of one job that measure 19.2 % and 20.1 % give the same verdict (warning, borderline)
    instead of one info and one critical. Clear of every band, the plain severity.
    """
    warning = T.cost_warning_pct if warning_pct is None else warning_pct
    for line, above, below in ((T.cost_critical_pct, "critical", "warning"),
                               (warning, "warning", "info")):
        m = margin_of(line, cost)
        if cost.pct >= line + m:
            return above, ""
        if cost.pct >= line - m:
            return below, (f"borderline: {cost.pct:.1f}% of {cost.of} is within {m:.1f} points of "
                           f"the {line:g}% line of a {above}; runs of the same job may measure "
                           "either side of it, so the lower verdict is given; measure again (a "
                           "longer window) before acting on it")
    return "info", ""


def settle(findings: list[Any]) -> None:
    """Apply :func:`judge` to every finding whose severity follows its cost (rules that set
    their own severity, or whose cost is not what decides it, are left as they are)."""
    for f in findings:
        if f.cost is None or f.severity != severity_for(f.cost):
            continue
        severity, note = judge(f.cost)
        if note:
            f.severity = severity
            f.mark_borderline(note)


def window_of(data: dict[str, Any]) -> tuple[float, str]:
    """The time a step-level cost is a share of: the steps, or the trace without steps."""
    kind = "step time" if data.get("window_kind") == "steps" else "trace time"
    return float(data.get("window_us") or 0.0), kind
