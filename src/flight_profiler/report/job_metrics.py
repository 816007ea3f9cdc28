"""Per-rank figures the job rules compare across ranks: compute versus collective time, and
where the training thread's time goes (``work``: see job_work.py).

Collectives are what a rank spends waiting for the others in: NCCL kernels on the GPU, and on
the CPU the ``c10d::`` operators and the backend's own annotations (``gloo:all_reduce``,
``nccl:all_reduce``), which span from the call to its completion. Compute is everything else the
rank ran: GPU compute kernels when the trace has a GPU, else CPU operators (merged over threads,
collective time removed). All times are microseconds.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.trace_loader import ANNOTATION, COMM, COMPUTE, CPU_OP, RawTrace

_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def total(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of ``a`` outside ``b`` (both merged and sorted)."""
    total = 0.0
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def is_comm(name: str) -> bool:
    return name.startswith(_COMM_PREFIXES)


def job_metrics(raw: RawTrace) -> dict[str, Any]:
    """Compute and collective time of one rank (what the straggler rule compares)."""
    names = raw.names
    comm: list[tuple[float, float]] = []
    cpu: list[tuple[float, float]] = []
    comm_calls = 0
    # Once per name, not per event (a with_stack trace: 350,000 events, ~6,000 names).
    comm_name = [is_comm(n) for n in names]
    for th in raw.threads.values():
        kinds, ids = th.kind, th.name
        for i in range(len(th.ts)):
            kind = kinds[i]
            if kind not in (CPU_OP, ANNOTATION):
                continue
            if comm_name[ids[i]]:
                comm.append((th.ts[i], th.end[i]))
                if kind == ANNOTATION or names[ids[i]].startswith("c10d::"):
                    comm_calls += 1
            elif kind == CPU_OP:
                cpu.append((th.ts[i], th.end[i]))
    for i in range(len(raw.g_ts)):
        if raw.g_kind[i] == COMM:
            comm.append((raw.g_ts[i], raw.g_end[i]))
    comm_m = merge(comm)
    if raw.g_ts:
        compute_m = merge([(raw.g_ts[i], raw.g_end[i]) for i in range(len(raw.g_ts))
                            if raw.g_kind[i] == COMPUTE])
        compute_us = minus(compute_m, comm_m)
        source = "gpu"
    else:
        compute_us = minus(merge(cpu), comm_m)
        source = "cpu"
    span = (raw.span_end - raw.span_ts) if raw.span_end > raw.span_ts else 0.0
    if raw.trace_window:
        span = max(span, raw.trace_window[1] - raw.trace_window[0])
    info = raw.meta.get("distributedInfo")
    work = None
    if isinstance(info, dict) or comm_calls:
        from flight_profiler.report.job_work import training_work

        work = training_work(raw)
    return {
        "compute_us": round(compute_us, 3),
        "collective_us": round(total(comm_m), 3),
        "collective_calls": comm_calls,
        "span_us": round(span, 3),
        "source": source,
        "backend": info.get("backend") if isinstance(info, dict) else None,
        "world_size": info.get("world_size") if isinstance(info, dict) else None,
        "work": work,
    }
