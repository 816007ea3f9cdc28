"""job-straggler: the rank the others wait for.

The analysis is job_waits.py (each rank's waits for the others against its own work, from the
traces; Flight Recorder's enqueue times; the stack samples); it is part of the one job verdict
(job_verdict.py), so that job-hang, job-desync, job-straggler and job-imbalance never
contradict each other.
"""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.rules.job_verdict import judge


def check(ctx: Context) -> list[Finding]:
    return [f for f in judge(ctx) if f.rule == "job-straggler"]


RULE = Rule("job-straggler", "One rank is slower than the others, who wait for it", check)
