"""The rule registry: one module per known pattern, each exposing ``RULE``.

A rule is a pure function of the loaded inputs (:class:`Context`) returning findings; its
thresholds come from :mod:`flight_profiler.report.thresholds` and are documented in
docs/report-rules.md. Adding a rule = adding a module here and its name to ``RULE_MODULES``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from flight_profiler.report.models import Finding, InputResult

RULE_MODULES = (
    "memory_leak", "graph_retention", "oom", "fragmentation", "transfer_bottleneck",
    "sync_bottleneck", "launch_overhead", "dataloader_bottleneck", "low_gpu_utilization",
    "hot_operators", "grad_health", "graph_chain", "eval_with_grad",
)


@dataclass
class Context:
    traces: list[InputResult] = field(default_factory=list)
    snapshots: list[InputResult] = field(default_factory=list)
    censuses: list[InputResult] = field(default_factory=list)
    grads: list[InputResult] = field(default_factory=list)  # `torch grads` documents
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
