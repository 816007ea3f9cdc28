"""The rule registry: one module per known pattern, each exposing ``RULE``.

The interface (stable; changes are additive):

- A module ``rules/<name>.py`` defines ``RULE = Rule(id, title, check)``; ``check(ctx)`` is a
  pure function of the loaded inputs (:class:`Context`) returning a list of
  :class:`~flight_profiler.report.models.Finding`; it never raises for odd figures (skip them).
  Register it by adding its module name to ``RULE_MODULES``.
- Thresholds come from :mod:`flight_profiler.report.thresholds` (``T.name``) and are documented,
  with their source, in docs/report-rules.md.
- A performance finding sets ``cost=`` a :class:`~flight_profiler.report.cost.Cost` (the share of
  step or GPU time its fix would recover, and how that was estimated: ``cost_of(us, whole_us,
  of, method)``) and takes its severity from it: ``severity=severity_for(cost)``. A pattern that
  costs nothing measurable is therefore at most info. Memory findings leave ``cost=None`` and
  choose their severity themselves.
- The engine orders findings by severity; within one, the job-breaking ones (wrong results, hang,
  OOM: ``JOB_BREAKING_RULES``) first, then cost (highest first), then rule id.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from flight_profiler.report.models import Finding, InputResult

RULE_MODULES = (
    "memory_leak", "graph_retention", "oom", "fragmentation", "transfer_bottleneck",
    "sync_bottleneck", "launch_overhead", "dataloader_bottleneck", "low_gpu_utilization",
    "communication", "hot_operators", "job_hang", "job_straggler", "job_imbalance",
    "grad_health", "graph_chain", "eval_with_grad", "arm_events",
)


@dataclass
class Context:
    traces: list[InputResult] = field(default_factory=list)
    snapshots: list[InputResult] = field(default_factory=list)
    censuses: list[InputResult] = field(default_factory=list)
    stacks: list[InputResult] = field(default_factory=list)  # per-rank stack samples
    grads: list[InputResult] = field(default_factory=list)  # `torch grads` documents
    arm_events: list[InputResult] = field(default_factory=list)  # `arm` evidence (event.json)
    # Several snapshots / censuses of one process, oldest first (only groups of >= 2).
    snapshot_series: list[list[InputResult]] = field(default_factory=list)
    census_series: list[list[InputResult]] = field(default_factory=list)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    check: Callable[[Context], list[Finding]]


def all_rules() -> list[Rule]:
    rules = []
    for mod in RULE_MODULES:
        module = importlib.import_module(f"{__name__}.{mod}")
        rules.append(module.RULE)
    return rules


def label(inp: InputResult) -> str:
    """How a finding names its input: file name, plus the rank for traces."""
    if inp.kind == "trace" and inp.rank is not None:
        return f"{inp.name} (rank {inp.rank})"
    return inp.name
