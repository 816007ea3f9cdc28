"""Offline diagnosis of Chrome traces, memory snapshots and tensor censuses.

    from flight_profiler.report import analyze
    report = analyze(["trace.json.gz", "snap.pickle"])
    for f in report.findings: print(f.rule, f.severity, f.title)
    data = report.to_dict()                # docs/report-schema.md
    # views: flight_profiler.render.formats.write_report(report, "report.html")

Never needs torch; pickles are loaded with a restricted unpickler.
"""

from __future__ import annotations

from flight_profiler.report.engine import analyze
from flight_profiler.report.models import SCHEMA_VERSION, SEVERITIES, Finding, InputResult, Report

__all__ = ["SCHEMA_VERSION", "SEVERITIES", "Finding", "InputResult", "Report", "analyze"]
