"""``analyze(paths) -> Report``: read every input, group snapshots/censuses into series per
process, run every registered rule, and order the findings (``Finding.order``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from flight_profiler.report.cost import settle
from flight_profiler.report.loaders import OWN_OUTPUT, expand, load_one
from flight_profiler.report.models import Finding, InputResult, Report
from flight_profiler.report.rules import Context, all_rules
from flight_profiler.report.rules.job_common import tag_ranks


def _series(items: list[InputResult]) -> list[list[InputResult]]:
    """Group by pid (inputs without one form one group), order by time (then mtime)."""
    groups: dict[object, list[InputResult]] = {}
    for it in items:
        groups.setdefault(it.data.get("pid"), []).append(it)

    def when(it: InputResult) -> float:
        t = it.data.get("time")
        if isinstance(t, (int, float)):
            return float(t)
        try:
            return os.path.getmtime(it.path)
        except OSError:
            return 0.0

    out = []
    for members in groups.values():
        if len(members) >= 2:
            out.append(sorted(members, key=when))
    return out


def build_context(inputs: list[InputResult]) -> Context:
    ok = [i for i in inputs if i.ok]
    ctx = Context(
        traces=[i for i in ok if i.kind == "trace"],
        snapshots=[i for i in ok if i.kind == "snapshot"],
        censuses=[i for i in ok if i.kind == "census"],
        stacks=[i for i in ok if i.kind == "stacks"],
        grads=[i for i in ok if i.kind == "grads"],
        arm_events=[i for i in ok if i.kind == "arm_event"],
    )
    # A `-r` recording is the allocations of a few calls: no point of memory over time.
    ctx.snapshot_series = _series([s for s in ctx.snapshots if not s.data.get("recorded_calls")])
    ctx.census_series = _series(ctx.censuses)
    return ctx


def _series_data(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for s in ctx.snapshot_series:
        out.append({"kind": "snapshot", "pid": s[0].data.get("pid"),
                    "points": [{"path": x.path, "time": x.data.get("time"), "label": x.data.get("label"),
                                "allocated": x.data["allocated"], "reserved": x.data["reserved"]}
                               for x in s]})
    for s in ctx.census_series:
        out.append({"kind": "census", "pid": s[0].data.get("pid"),
                    "points": [{"path": x.path, "time": x.data.get("time"), "label": x.data.get("label"),
                                "bytes": x.data["totals"]["bytes"], "count": x.data["totals"]["count"],
                                "with_grad_fn": x.data["totals"]["with_grad_fn"],
                                "graph_bytes": x.data["totals"]["graph_bytes"]} for x in s]})
    return out


# Below ~2 s of work that can run beside the biggest input's, starting worker processes (spawn:
# ~0.5 s, and each imports the report again) costs more than it saves: one big trace and small
# files (diagnose's artefacts: a with_stack profile of 3 LBFGS steps, 60 MB decoded) took 5.2 s
# in 2 workers and 2.2 s in one process.
PARALLEL_MIN_BYTES = 48 << 20


def _load_all(files: list[str], jobs: int | None,
              loaded: Mapping[str, InputResult] | None = None) -> list[InputResult]:
    """Load inputs, several at a time in worker processes when they are big (several ranks);
    those in ``loaded`` (by path) were loaded already."""
    if loaded:
        todo = [f for f in files if f not in loaded]
        fresh = dict(zip(todo, _load_all(todo, jobs))) if todo else {}
        return [loaded[f] if f in loaded else fresh[f] for f in files]
    if jobs is None:
        jobs = int(os.environ.get("FP_REPORT_JOBS", "0") or 0) or (os.cpu_count() or 1)
    if jobs > 1 and len(files) > 1:
        sizes = [0]  # bytes of JSON to decode, roughly: gzip shrinks traces ~10x
        for f in files:
            with contextlib.suppress(OSError):
                sizes.append(os.path.getsize(f) * (10 if f.endswith(".gz") else 1))
        # The biggest input takes as long in a worker as here: what the workers can save is
        # the rest of the work, loaded beside it.
        if sum(sizes) - max(sizes) >= PARALLEL_MIN_BYTES:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn, not fork: the caller (diagnose) may have threads running.
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=ctx) as pool:
                return list(pool.map(load_one, files))
    return [load_one(f) for f in files]


def analyze(paths: Iterable[str], jobs: int | None = None,
            loaded: Mapping[str, InputResult] | None = None) -> Report:
    """Diagnose traces, memory snapshots and tensor censuses; never raises for a bad file.

    ``jobs``: worker processes for big multi-file inputs (default: CPU count, or
    $FP_REPORT_JOBS; 1 = all in this process). ``loaded``: inputs the caller has loaded already
    (``load_one``), by path: diagnose loads its first artefacts while it waits for the job."""
    notes: list[InputResult] = []  # directories whose walk stopped at a cap
    walked: set[str] = set()
    inputs = _load_all(expand([os.fspath(p) for p in paths], notes, walked), jobs, loaded)
    # diagnose.json / report.json in a diagnose directory: not inputs, not worth a warning.
    inputs = [i for i in inputs if not (i.kind == OWN_OUTPUT and i.path in walked)] + notes
    ctx = build_context(inputs)
    findings: list[Finding] = []
    for rule in all_rules():
        findings.extend(rule.check(ctx))
    settle(findings)  # the stated margin around severity lines
    tag_ranks(inputs, findings)
    findings.sort(key=Finding.order)
    return Report(inputs=inputs, findings=findings, series=_series_data(ctx))
