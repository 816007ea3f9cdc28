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


def ddp_rank_trace(path: Path, rank: int, world: int, own: list[dict[str, float]],
                   steps: int = 8, comm_us: float = 400.0, fwd_us: float = 600.0,
                   bwd_us: float = 900.0, profiler_steps: bool = False,
                   step_extra_us: list[float] | None = None, method_steps: bool = False) -> Path:
    """One rank of a DDP job on gloo as torch.profiler records it with ``with_stack`` (Python
    frames), window mode (no ProfilerStep unless ``profiler_steps``): the training loop on the
    main thread (tid 1), gloo's thread (tid 2), a prefetch thread (tid 3) feeding a queue.

    ``own[r]``: rank r's extra work per step by kind, before its forward: ``sleep`` (time.sleep
    in log_metrics), ``data`` (the DataLoader's __next__ on the main thread), ``blocked``
    (waiting for a batch from the prefetch thread, which meanwhile waits for the DataLoader),
    ``compute`` (operators in expensive_metric). ``step_extra_us[r]`` lengthens rank r's
    ProfilerStep annotations (steps traced at other moments than the others'). ``method_steps``:
    as ``diagnose PID METHOD`` profiles, one session per call of train_step, each a ProfilerStep
    (the extra work before it is not recorded). Every rank's gradient all-reduce completes when
    the slowest rank enqueues it, plus ``comm_us``: the others wait for it inside backward (no
    operator running), as DDP's reducer makes them."""
    ev: list[dict[str, Any]] = []

    def x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur})

    def py(name: str, ts: float, dur: float, tid: int = 1) -> None:
        x("python_function", name, ts, dur, tid)

    def ops(ts: float, dur: float, n: int, prefix: str = "aten::mm") -> None:
        for k in range(n):
            x("cpu_op", prefix, ts + k * dur / n, dur / n * 0.95)

    # "starved": time inside backward without an operator before the rank enqueues its
    # all-reduce (no CPU, or no GIL, for its thread): its own slowness, not a wait
    totals = [sum(o.values()) + fwd_us + bwd_us for o in own]
    t = 1_000_000.0
    start = t
    for s in range(steps):
        mine = own[rank]
        period = max(totals) + comm_us + 20
        if profiler_steps:
            extra = step_extra_us[rank] * (1.0 + (0.01 if s % 2 else -0.01)) if step_extra_us else 0.0
            x("user_annotation", f"ProfilerStep#{s}", t, period + extra)
        py("ddp_trainer.py(130): main", t, period)
        c = t + 1
        if mine.get("blocked"):
            d = mine["blocked"]
            py("ddp_trainer.py(94): wait_for_batch", c, d)
            py("queue.py(171): get", c + 1, d - 2)
            py("threading.py(327): wait", c + 2, d - 4)
            py("<built-in method acquire of _thread.lock object at 0x7f0000000001>", c + 3, d - 6)
            x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
              c, d, tid=3)
            py("torch/utils/data/dataloader.py(720): __next__", c, d, tid=3)
            c += d
        if mine.get("data"):
            d = mine["data"]
            py("torch/utils/data/dataloader.py(720): __next__", c, d)
            x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", c, d)
            c += d
        if mine.get("sleep"):
            d = mine["sleep"]
            py("ddp_trainer.py(67): log_metrics", c, d)
            py("<built-in function sleep>", c + 1, d - 2)
            c += d
        if mine.get("compute"):
            d = mine["compute"]
            py("ddp_trainer.py(58): expensive_metric", c, d)
            ops(c + 1, d - 2, 8, "aten::matmul")
            c += d
        if method_steps:
            ev[:] = [e for e in ev if e["ts"] < t]  # nothing recorded between the calls
            x("user_annotation", f"ProfilerStep#{s}", c, t + period - c - 5)
        py("ddp_trainer.py(97): train_step", c, t + period - c - 5)
        x("user_annotation", "DistributedDataParallel.forward", c + 1, fwd_us)
        ops(c + 2, fwd_us - 4, 6)
        c += fwd_us
        done = t + max(totals) + comm_us
        py("torch/_tensor.py(626): backward", c, done - c)
        py("<built-in method run_backward of torch._C._EngineBase object at 0x7f0000000002>", c + 1, done - c - 2)
        starved = mine.get("starved", 0.0)
        ops(c + 2 + starved, bwd_us - 4, 6, "autograd::engine::evaluate_function: AddmmBackward0")
        enqueue = c + bwd_us + starved
        x("cpu_op", "c10d::allreduce_", enqueue - 3, 2)
        x("user_annotation", "gloo:all_reduce", enqueue, done - enqueue, tid=2)
        x("cpu_op", "torch.distributed.ddp.reducer::copy_bucket_to_grad", done - 1, 0.5)
        t += period + 10
    ev.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
               "tid": "PyTorch Profiler", "ts": start - 5, "dur": t - start + 10})
    doc = {"schemaVersion": 1, "deviceProperties": [],
           "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
           "traceEvents": ev, "traceName": f"rank {rank}"}
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return path


def ddp_traces(directory: Path, own: list[dict[str, float]], **kw: Any) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [ddp_rank_trace(directory / f"rank{r}.pt.trace.json.gz", r, len(own), own, **kw)
            for r in range(len(own))]
