"""Per-rank CPU traces of a gloo job, shaped like torch.profiler's (distributedInfo, ProfilerStep
annotations, ``cpu_op`` operators on the main thread, ``gloo:all_reduce`` spans on gloo's thread).

Each step: the rank computes ``compute_us`` (split into operators), then all_reduces; the
collective ends when the slowest rank arrives, so fast ranks wait in it. Used by the job rule
tests and by bench/bench_ranks.py (8 ranks x ~100 k events).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def rank_trace(path: Path, rank: int, world: int, compute_us: list[float], steps: int = 6,
               ops_per_step: int = 20, comm_us: float = 300.0, jitter: float = 0.0,
               mem_bytes: list[int] | None = None, step_extra_us: list[float] | None = None) -> Path:
    """``compute_us[r]``: each rank's compute per step (so every rank's waits line up);
    ``mem_bytes[r]``: allocated bytes in ``[memory]`` events (reserved = 1.25x);
    ``step_extra_us[r]``: added to that rank's ProfilerStep durations (unsynchronised steps)."""
    ev: list[dict[str, Any]] = []
    t = 1_000_000.0
    for s in range(steps):
        mine = compute_us[rank] * (1.0 + (jitter if (s + rank) % 2 else -jitter))
        slowest = max(compute_us) * (1.0 + jitter)
        step_us = slowest + comm_us + 10
        extra = step_extra_us[rank] if step_extra_us else 0.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1,
                   "tid": 1, "ts": t, "dur": step_us + extra * (1.0 + (0.01 if s % 2 else -0.01))})
        if mem_bytes:
            ev.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": t + 1,
                       "args": {"Device Type": 0, "Device Id": -1, "Addr": 1000 + s,
                                "Bytes": 1024, "Total Allocated": mem_bytes[rank],
                                "Total Reserved": int(mem_bytes[rank] * 1.25)}})
        op_us = mine / ops_per_step
        for k in range(ops_per_step):
            name = "aten::tanh" if k % 2 else "aten::mm"
            ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1,
                       "ts": t + 1 + k * op_us, "dur": op_us * 0.98, "args": {}})
        start = t + 2 + mine
        end = t + 2 + slowest + comm_us
        ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1,
                   "ts": start, "dur": 5.0, "args": {}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1,
                   "tid": 2, "ts": start + 1, "dur": end - start - 1})
        t += step_us + 20 + extra
    doc = {"schemaVersion": 1, "deviceProperties": [],
           "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
           "traceEvents": ev, "traceName": f"rank {rank}"}
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return path


def job_traces(directory: Path, compute_us: list[float], **kw: Any) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [rank_trace(directory / f"rank{r}.pt.trace.json.gz", r, len(compute_us), compute_us, **kw)
            for r in range(len(compute_us))]
