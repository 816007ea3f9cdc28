"""Plain-data results of a report: inputs with their measured figures, and findings.

Everything here is JSON-ready through ``to_dict()``; the schema is docs/report-schema.md
(``SCHEMA_VERSION`` below). Views (Markdown, HTML, terminal) live in flight_profiler.render,
which writes report files too (``render.formats.write_report``): a report never renders itself.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from flight_profiler import __version__
from flight_profiler.report.cost import Cost

SCHEMA_VERSION = 1
SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
# Findings that say the job itself is broken (its results are wrong, it is hung, it dies) come
# before the ones that say it is slow or big, within a severity: a faster loop that trains a
# diverging model helps nobody.
JOB_BREAKING_RULES = frozenset({"grad-health", "job-hang", "job-desync", "oom", "arm-hang",
                                "arm-nan", "arm-oom"})


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int)) else str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


@dataclass
class Finding:
    """One diagnosed problem: stable rule id, severity, evidence with numbers, where, fix."""

    rule: str
    severity: str
    title: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    root_cause: str = ""
    inputs: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    # The ranks a job-level finding is about (None: not a job finding; []: the whole job).
    ranks: list[int] | None = None
    # Performance findings: what the fix would recover; None for memory findings.
    cost: Cost | None = None
    # Near a severity line: why the lower verdict was given (report/cost.py judge); "" if clear.
    borderline: str = ""

    def mark_borderline(self, note: str) -> None:
        """Say, in the title and the evidence, that the verdict sits on a line."""
        self.borderline = note
        if "borderline" not in self.title:
            self.title += " (borderline)"
        self.evidence.append(note)

    @property
    def cost_pct(self) -> float:
        return self.cost.pct if self.cost is not None else -1.0

    def order(self) -> tuple[int, int, float, str]:
        """The sort key of every findings list: worst severity first; within it, what breaks
        the job first, then the costliest (memory findings, with no time cost, after the
        performance findings they share a severity with), then by rule id."""
        return (-SEVERITY_RANK[self.severity], 0 if self.rule in JOB_BREAKING_RULES else 1,
                -self.cost_pct, self.rule)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "severity": self.severity, "title": self.title,
            "summary": self.summary, "evidence": list(self.evidence), "where": list(self.where),
            "fix": list(self.fix), "root_cause": self.root_cause, "inputs": list(self.inputs),
            "metrics": self.metrics,
            **({"ranks": list(self.ranks)} if self.ranks is not None else {}),
            **({"borderline": self.borderline} if self.borderline else {}),
            "cost": self.cost.to_dict() if self.cost is not None else None,
        }


@dataclass
class InputResult:
    """One input file: what it was detected as, whether it could be read, and its figures."""

    path: str
    kind: str  # trace | snapshot | census | unknown
    ok: bool
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    elapsed_s: float = 0.0

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/")) or self.path

    @property
    def notes(self) -> list[str]:
        """What reading left out of a trace's figures (trace_metrics.loader_notes)."""
        notes = self.data.get("notes") if self.kind == "trace" and self.ok else None
        return [str(n) for n in notes] if isinstance(notes, list) else []

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "kind": self.kind, "ok": self.ok,
                             "error": self.error, "elapsed_s": round(self.elapsed_s, 4)}
        if self.kind == "stacks":
            d["rank"] = self.rank
            if self.ok:  # the samples themselves stay in the input file
                d["data"] = {"pid": self.data.get("pid"), "samples": len(self.data.get("samples", []))}
        elif self.kind == "trace":
            d["rank"] = self.rank
            d["metrics"] = self.data
        elif self.ok:
            d["data"] = self.data
        return d


@dataclass
class Report:
    inputs: list[InputResult]
    findings: list[Finding]
    series: list[dict[str, Any]] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    # A report merged from several nodes' directories: the job, its nodes and the ranks in no
    # directory (report/job_merge.py); None otherwise.
    job: dict[str, Any] | None = None

    @property
    def readable(self) -> list[InputResult]:
        return [i for i in self.inputs if i.ok]

    @property
    def errors(self) -> list[InputResult]:
        return [i for i in self.inputs if not i.ok]

    @property
    def worst_severity(self) -> str | None:
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=SEVERITY_RANK.__getitem__)

    def reaches(self, severity: str) -> bool:
        """True if any finding is at least ``severity`` (for --fail-on)."""
        floor = SEVERITY_RANK[severity]
        return any(SEVERITY_RANK[f.severity] >= floor for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "flight_profiler", "version": __version__},
            "created": round(self.created, 3),
            "summary": {"findings": counts, "worst_severity": self.worst_severity,
                        "inputs_read": len(self.readable), "inputs_failed": len(self.errors)},
            "inputs": [i.to_dict() for i in self.inputs],
            "findings": [f.to_dict() for f in self.findings],
            "series": self.series,
            **({"job": self.job} if self.job is not None else {}),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON (RFC 8259): a NaN or an infinity from a hostile input becomes null."""
        return json.dumps(strict(self.to_dict()), indent=indent, default=str, allow_nan=False)
