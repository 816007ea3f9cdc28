"""Offline diagnosis of Chrome traces, memory snapshots and tensor censuses.

    from flight_profiler.report import analyze
    report = analyze(["trace.json.gz", "snap.pickle"])
    for f in report.findings: print(f.rule, f.severity, f.title)
    data = report.to_dict()                # docs/report-schema.md
    # views: flight_profiler.render.formats.write_report(report, "report.html")

Never needs torch; pickles are loaded with a restricted unpickler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.report.models import SCHEMA_VERSION, SEVERITIES, Finding, InputResult, Report

if TYPE_CHECKING:
    from flight_profiler.report.engine import analyze

__all__ = ["SCHEMA_VERSION", "SEVERITIES", "Finding", "InputResult", "Report", "analyze"]


def __getattr__(name: str) -> Any:
    # The engine (loaders, every rule) loads on first use: the CLI takes constants and
    # formatters from report/ (severities, units) at startup, where 50 ms of rules would show.
    if name == "analyze":
        from flight_profiler.report.engine import analyze

        return analyze
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
