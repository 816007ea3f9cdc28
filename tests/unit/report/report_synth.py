"""Schema-faithful synthetic inputs for the report tests (GPU traces, CUDA snapshots, censuses).

Field names and shapes follow /work/shared/design/torch-formats.md and the census format in the
task; values are chosen so that each pattern is (or is not) present.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

PID, TID = 100, 100


def gpu_trace(
    path: Path,
    *,
    steps: int = 6,
    kernels_per_step: int = 40,
    kernel_us: float = 200.0,
    launch_gap_us: float = 0.0,
    copy_bytes: int = 0,
    copy_kind: str = "Pageable",
    copy_us: float = 0.0,
    sync_wait_us: float = 0.0,
    dataloader_us: float = 0.0,
    rank: int = 0,
    mem_growth_per_step: int = 0,
) -> Path:
    """A GPU training trace: per step a DataLoader span, an optional HtoD copy from train.py:41,
    kernels launched from model.py:100 and an optional loss.item() sync at train.py:57."""
    ev: list[dict[str, Any]] = []
    t, gpu_t, corr = 1_000_000.0, 1_000_000.0, 1
    allocated = 100 << 20

    def x(cat: str, name: str, ts: float, dur: float, args: dict[str, Any] | None = None,
          pid: int = PID, tid: int = TID) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                   "dur": dur, "args": args or {}})

    for s in range(steps):
        start = t
        if dataloader_us:
            x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
              t + 1, dataloader_us)
            t += dataloader_us + 2
        if copy_bytes:
            corr += 1
            x("python_function", "train.py(41): train_step", t, 30 + copy_us)
            x("cpu_op", "aten::to", t + 1, 25 + copy_us)
            x("cuda_runtime", "cudaMemcpyAsync", t + 2, 20 + copy_us, {"correlation": corr})
            gpu_t = max(gpu_t, t + 3)
            x("gpu_memcpy", f"Memcpy HtoD ({copy_kind} -> Device)", gpu_t, copy_us,
              {"device": 0, "stream": 7, "correlation": corr, "bytes": copy_bytes}, pid=0, tid=7)
            gpu_t += copy_us
            t += 32 + copy_us
        for _ in range(kernels_per_step):
            corr += 1
            x("python_function", "model.py(100): forward", t, 12)
            x("cpu_op", "aten::mul", t + 1, 10)
            x("cuda_runtime", "cudaLaunchKernel", t + 2, 5, {"correlation": corr})
            gpu_t = max(gpu_t, t + 8)
            x("kernel", "void at::native::vectorized_elementwise_kernel<4, MulFunctor>()", gpu_t,
              kernel_us, {"device": 0, "stream": 7, "correlation": corr}, pid=0, tid=7)
            gpu_t += kernel_us
            if mem_growth_per_step:
                allocated += mem_growth_per_step // kernels_per_step
                ev.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID,
                           "tid": TID, "ts": t + 1.5, "s": "t",
                           "args": {"Total Reserved": 4 << 30, "Total Allocated": allocated,
                                    "Bytes": mem_growth_per_step // kernels_per_step,
                                    "Addr": 10_000 + corr, "Device Id": 0, "Device Type": 1}})
            t += 12 + launch_gap_us
        if sync_wait_us:
            corr += 1
            wait = max(sync_wait_us, gpu_t - t)
            x("python_function", "train.py(57): train_step", t, wait + 20)
            x("cpu_op", "aten::item", t + 1, wait + 16)
            x("cpu_op", "aten::_local_scalar_dense", t + 2, wait + 14)
            x("cuda_runtime", "cudaMemcpyAsync", t + 3, 5, {"correlation": corr})
            x("cuda_runtime", "cudaStreamSynchronize", t + 9, wait, {"correlation": corr + 1})
            x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", max(gpu_t, t + 4), 2,
              {"device": 0, "stream": 7, "correlation": corr, "bytes": 4}, pid=0, tid=7)
            corr += 1
            t += wait + 22
        x("user_annotation", f"ProfilerStep#{s}", start, t - start)
        t += 2
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": rank},
           "deviceProperties": [{"id": 0, "name": "Synthetic GPU", "totalGlobalMem": 16 << 30}],
           "traceEvents": ev, "traceName": "synthetic"}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return path


def block(size: int, state: str, filename: str = "train.py", line: int = 10) -> dict[str, Any]:
    return {"address": 0, "size": size, "requested_size": size, "state": state,
            "frames": [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                        "line": 125, "name": "forward"},
                       {"filename": filename, "line": line, "name": "step"}]}


def snapshot(
    *,
    allocated: list[tuple[int, str, int]] = (),  # type: ignore[assignment]
    inactive: list[int] = (),  # type: ignore[assignment]
    split: bool = True,
    oom: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    fp: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Segments holding the given allocated blocks (size, file, line) and inactive blocks."""
    segments = []
    blocks = [block(sz, "active_allocated", f, ln) for sz, f, ln in allocated]
    free = [block(sz, "inactive") for sz in inactive]
    if split:
        blocks_all = blocks + free
        total = sum(b["size"] for b in blocks_all)
        segments.append({"device": 0, "address": 0, "total_size": total,
                         "allocated_size": sum(b["size"] for b in blocks),
                         "active_size": sum(b["size"] for b in blocks), "requested_size": 0,
                         "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
                         "is_expandable": False, "frames": [], "blocks": blocks_all})
    else:
        for b in blocks + free:
            segments.append({"device": 0, "address": 0, "total_size": b["size"],
                             "allocated_size": b["size"] if b["state"] == "active_allocated" else 0,
                             "active_size": 0, "requested_size": 0, "stream": 0,
                             "segment_type": "large", "segment_pool_id": [0, 0],
                             "is_expandable": False, "frames": [], "blocks": [b]})
    traces: list[list[dict[str, Any]]] = [[]]
    if oom:
        traces[0].append({"action": "oom", "addr": 0, "size": oom["size"], "stream": 0,
                          "time_us": 123, "device_free": oom["device_free"],
                          "frames": [{"filename": "train.py", "line": 88, "name": "forward"}]})
    doc: dict[str, Any] = {"segments": segments, "device_traces": traces,
                           "allocator_settings": settings if settings is not None else
                           {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}}
    if fp is not None:
        doc["flight_profiler"] = fp
    return doc


def write_pickle(path: Path, obj: Any) -> Path:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)
    return path


def census(pid: int, time: float, holders: list[dict[str, Any]], label: str = "") -> dict[str, Any]:
    total_count = sum(h["count"] for h in holders) + 10
    total_bytes = sum(h["bytes"] for h in holders) + 4096
    return {
        "format": "flight_profiler.census", "version": 1, "pid": pid, "time": time, "label": label,
        "totals": {"count": total_count, "bytes": total_bytes,
                   "with_grad_fn": sum(h["with_grad_fn"] for h in holders),
                   "graph_bytes": sum(h["graph_bytes"] for h in holders),
                   "by_device": {"cpu": {"count": total_count, "bytes": total_bytes}}},
        "groups": [{"device": "cpu", "dtype": "float32", "shape": [32, 10], "count": total_count,
                    "bytes": total_bytes, "with_grad_fn": 0}],
        "holders": holders, "sites": [], "skipped": {"objects": 0, "reason": ""}, "elapsed_s": 0.1,
    }


def holder(path: str, count: int, nbytes: int, grad: int = 0, graph: int = 0,
           kind: str = "list") -> dict[str, Any]:
    return {"path": path, "example": path.replace("[*]", "[0]"), "kind": kind, "count": count,
            "bytes": nbytes, "with_grad_fn": grad, "graph_bytes": graph}


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path
