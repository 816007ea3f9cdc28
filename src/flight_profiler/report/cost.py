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
    """An estimate: ``us`` microseconds, ``pct`` percent of ``of``; ``method`` says how."""

    pct: float
    us: float
    of: str  # "step time" | "trace time" | "GPU time"
    method: str

    def to_dict(self) -> CostDict:
        return {"pct": round(self.pct, 3), "us": round(self.us, 3), "of": self.of,
                "method": self.method}


def cost_of(us: float, whole_us: float, of: str, method: str) -> Cost:
    """``us`` out of ``whole_us`` (clamped to 0..100 %: estimates can overlap their whole)."""
    us = max(0.0, us)
    pct = min(100.0, 100.0 * us / whole_us) if whole_us > 0 else 0.0
    return Cost(pct=pct, us=us, of=of, method=method)


def severity_for(cost: Cost) -> str:
    """critical >= T.cost_critical_pct, warning >= T.cost_warning_pct, else info."""
    if cost.pct >= T.cost_critical_pct:
        return "critical"
    if cost.pct >= T.cost_warning_pct:
        return "warning"
    return "info"


def window_of(data: dict[str, Any]) -> tuple[float, str]:
    """The time a step-level cost is a share of: the steps, or the trace without steps."""
    kind = "step time" if data.get("window_kind") == "steps" else "trace time"
    return float(data.get("window_us") or 0.0), kind
