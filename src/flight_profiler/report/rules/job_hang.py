"""job-hang / job-desync: ranks wait in a collective that one or more ranks never reach.

The analysis is job_stacks.py (from the ranks' stack samples and Flight Recorder); it is part of
the one job verdict (job_verdict.py), so that job-hang, job-desync and job-straggler never
contradict each other.
"""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.rules.job_verdict import judge


def check(ctx: Context) -> list[Finding]:
    return [f for f in judge(ctx) if f.rule in ("job-hang", "job-desync")]


RULE = Rule("job-hang", "A rank never reaches the collective the others wait in", check)
