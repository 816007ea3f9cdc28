"""One verdict for a whole job: hang, desync, straggler or step-time imbalance, judged together
from every rank's stack samples, traces and Flight Recorder, so that the job rules (job-hang,
job-desync, job-straggler, job-imbalance) never contradict each other.

1. Stuck (some ranks wait in a collective that others never reach, in every sample, without
   moving; or every rank waits, in different collectives): job-hang / job-desync, critical.
   Nothing else is said about the ranks' speed: a stuck job has none.
2. Otherwise, with per-rank traces: the rank the others wait for (job-straggler), from their
   waits and its own work (job_straggler.py); the stack samples and Flight Recorder are its
   evidence. A rank the stacks saw "behind" is the traces' to judge.
3. Without traces: the stacks' "behind" warning (job-hang), or Flight Recorder's latest rank.
4. Step times that differ across ranks are a finding of their own (job-imbalance) only where
   they cannot be the straggler's doing: when no straggler was found.

Each rule module asks ``judge(ctx)`` and keeps its own findings; the verdict is computed once
per report (the last context is remembered).
"""

from __future__ import annotations

import threading

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context
from flight_profiler.report.rules.job_common import by_rank

_LAST: tuple[Context, list[Finding]] | None = None
_LOCK = threading.Lock()


def judge(ctx: Context) -> list[Finding]:
    global _LAST
    with _LOCK:
        if _LAST is not None and _LAST[0] is ctx:
            return list(_LAST[1])
        findings = _judge(ctx)
        _LAST = (ctx, findings)
        return list(findings)


def _judge(ctx: Context) -> list[Finding]:
    from flight_profiler.report.rules import job_fr
    from flight_profiler.report.rules.job_stacks import StackRank, latest, stack_findings
    from flight_profiler.report.rules.job_steps import step_findings
    from flight_profiler.report.rules.job_waits import rank_figures, straggler_findings

    stacks = {r: latest(inputs) for r, inputs in by_rank(ctx.stacks).items()}
    fr = job_fr.read(stacks)
    ranks = {r: StackRank(r, inp) for r, inp in stacks.items()}
    figs = rank_figures(ctx.traces)
    hang = stack_findings(ranks, fr, set(figs))
    if hang:  # stuck, or behind where no trace measures by how much
        return hang
    straggler = straggler_findings(ctx, figs, fr, job_fr.status_line(fr, sorted(stacks)))
    if straggler:
        return straggler
    return step_findings(ctx.traces, figs)
