"""eval-with-grad: placeholder replaced below."""
from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule


def check(ctx: Context) -> list[Finding]:
    return []


RULE = Rule("eval-with-grad", "Inference with autograd on", check)
