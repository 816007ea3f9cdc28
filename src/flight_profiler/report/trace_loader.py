"""One streaming pass over a Chrome trace into compact columns (``array``), nothing per event kept.

What is kept: GPU activity intervals (for the HTA-style breakdown), CPU-side intervals of
operators, Python frames and annotations per thread (for self time and for naming the Python
line behind a sync or a copy), the CUDA runtime calls' correlation ids, ``[memory]`` samples,
the steps and the DataLoader spans. A 1 M-event trace keeps a few tens of MB.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import Any

from flight_profiler.report.jsonstream import iter_trace, open_text_bytes

# HTA's kernel classes (hta/utils/utils.py): communication, memory, computation, other.
COMPUTE, MEMORY, COMM, OTHER = 0, 1, 2, 3
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
})
SCALAR_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
CPU_OP, PY_FRAME, ANNOTATION = 0, 1, 2
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def gpu_kind(name: str) -> int:
    if name.startswith("nccl") or "gloo:" in name:
        return COMM
    if _MEMORY_RE.match(name):
        return MEMORY
    if _NOT_COMPUTE_RE.match(name):
        return OTHER
    return COMPUTE


@dataclass
class ThreadIntervals:
    """CPU-side spans of one thread: operators, Python frames, annotations."""

    ts: array[float] = field(default_factory=lambda: array("d"))
    end: array[float] = field(default_factory=lambda: array("d"))
    name: array[int] = field(default_factory=lambda: array("l"))
    kind: array[int] = field(default_factory=lambda: array("b"))
    sorted: bool = True
    order: list[int] | None = None


@dataclass
class RawTrace:
    path: str
    meta: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    names: list[str] = field(default_factory=list)
    name_ids: dict[str, int] = field(default_factory=dict)
    # GPU activity (kernels, memcpy, memset, cuda_sync)
    g_ts: array[float] = field(default_factory=lambda: array("d"))
    g_end: array[float] = field(default_factory=lambda: array("d"))
    g_kind: array[int] = field(default_factory=lambda: array("b"))
    g_corr: array[int] = field(default_factory=lambda: array("q"))
    g_name: array[int] = field(default_factory=lambda: array("l"))
    gpu_devices: set[int] = field(default_factory=set)
    memcpy: list[tuple[str, float, int, int]] = field(default_factory=list)  # name, dur, bytes, corr
    # CUDA runtime / driver calls
    rt_corr: array[int] = field(default_factory=lambda: array("q"))
    rt_ts: array[float] = field(default_factory=lambda: array("d"))
    rt_tid: array[int] = field(default_factory=lambda: array("q"))
    runtime: dict[str, list[float]] = field(default_factory=dict)  # name -> [count, total_us]
    syncs: list[tuple[int, float, float, str]] = field(default_factory=list)  # tid, ts, dur, name
    scalar_ops: list[tuple[int, float, float, str]] = field(default_factory=list)
    threads: dict[int, ThreadIntervals] = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # number, ts, dur
    dataloader: list[tuple[int, float, float]] = field(default_factory=list)  # thread, ts, dur
    # [memory] samples per (device type, device id)
    mem: dict[tuple[int, int], tuple[array[float], array[int], array[int]]] = field(default_factory=dict)
    mem_live: dict[tuple[int, int], dict[int, tuple[float, int, int]]] = field(default_factory=dict)
    span_ts: float = float("inf")
    span_end: float = float("-inf")
    trace_window: tuple[float, float] | None = None
    # Autograd: forward ops that recorded a graph node ("Sequence number", "Fwd thread id" 0;
    # backward functions carry the forward thread's id), and backward functions run (autograd::engine::evaluate_function: ...).
    autograd_fwd_ops: int = 0
    backward_ops: int = 0
    autograd_fwd_names: dict[str, int] = field(default_factory=dict)

    def intern(self, name: str) -> int:
        i = self.name_ids.get(name)
        if i is None:
            i = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return i


def _thread_key(pid: Any, tid: Any) -> int:
    # pid/tid are ints in torch traces; strings appear for synthetic rows ("Spans").
    try:
        return (int(pid) << 32) ^ int(tid)
    except (TypeError, ValueError):
        return hash((pid, tid))


def load_trace(path: str) -> RawTrace:
    """Stream ``path`` (Chrome trace, plain or gzipped) into a :class:`RawTrace`."""
    raw = RawTrace(path)
    kinds: dict[str, int] = {}
    intern = raw.intern
    threads = raw.threads
    last_ts: dict[int, float] = {}
    runtime = raw.runtime

    def on_meta(key: str, value: Any) -> None:
        raw.meta[key] = value

    counts: dict[str, int] = {}
    with open_text_bytes(path) as stream:
        for e in iter_trace(stream, on_meta, counts):
            raw.events += 1
            ph = e.get("ph")
            if ph == "X":
                cat = e.get("cat")
                try:
                    ts = float(e["ts"])
                    end = ts + float(e.get("dur", 0.0))
                except (KeyError, TypeError, ValueError):
                    continue
                name = e.get("name", "")
                if not isinstance(name, str):
                    name = str(name)
                args = e.get("args") or {}
                if cat in _GPU_CATS or (cat != "gpu_user_annotation" and "stream" in args):
                    stream_id = args.get("stream", -1)
                    if stream_id is None or stream_id == -1:
                        continue
                    k = kinds.get(name)
                    if k is None:
                        k = kinds[name] = gpu_kind(name)
                    corr = args.get("correlation", -1)
                    raw.g_ts.append(ts)
                    raw.g_end.append(end)
                    raw.g_kind.append(k)
                    raw.g_corr.append(corr if isinstance(corr, int) else -1)
                    raw.g_name.append(intern(name))
                    dev = args.get("device", e.get("pid"))
                    if isinstance(dev, int):
                        raw.gpu_devices.add(dev)
                    if cat == "gpu_memcpy" or name.startswith("Memcpy"):
                        nbytes = args.get("bytes", 0)
                        raw.memcpy.append((name, end - ts, nbytes if isinstance(nbytes, int) else 0,
                                           corr if isinstance(corr, int) else -1))
                    continue
                if cat == "cuda_runtime" or cat == "cuda_driver":
                    corr = args.get("correlation")
                    key = _thread_key(e.get("pid"), e.get("tid"))
                    if isinstance(corr, int):
                        raw.rt_corr.append(corr)
                        raw.rt_ts.append(ts)
                        raw.rt_tid.append(key)
                    agg = runtime.get(name)
                    if agg is None:
                        runtime[name] = [1, end - ts]
                    else:
                        agg[0] += 1
                        agg[1] += end - ts
                    if name in SYNC_CALLS:
                        raw.syncs.append((key, ts, end - ts, name))
                    continue
                if cat == "cpu_op" or cat == "python_function" or cat == "user_annotation":
                    key = _thread_key(e.get("pid"), e.get("tid"))
                    th = threads.get(key)
                    if th is None:
                        th = threads[key] = ThreadIntervals()
                    prev = last_ts.get(key)
                    if prev is not None and ts < prev:
                        th.sorted = False
                    last_ts[key] = ts
                    th.ts.append(ts)
                    th.end.append(end)
                    th.name.append(intern(name))
                    if cat == "cpu_op":
                        th.kind.append(CPU_OP)
                        if name.startswith("autograd::engine::evaluate_function"):
                            raw.backward_ops += 1
                        elif "Sequence number" in args and not args.get("Fwd thread id"):
                            raw.autograd_fwd_ops += 1
                            raw.autograd_fwd_names[name] = raw.autograd_fwd_names.get(name, 0) + 1
                        if name in SCALAR_OPS:
                            raw.scalar_ops.append((key, ts, end - ts, name))
                    elif cat == "python_function":
                        th.kind.append(PY_FRAME)
                    else:
                        th.kind.append(ANNOTATION)
                        if name.startswith("ProfilerStep"):
                            m = _STEP_RE.match(name)
                            raw.steps.append((int(m.group(1)) if m else len(raw.steps), ts, end - ts))
                        elif name.startswith("enumerate(DataLoader)"):
                            raw.dataloader.append((key, ts, end - ts))
                    if ts < raw.span_ts:
                        raw.span_ts = ts
                    if end > raw.span_end:
                        raw.span_end = end
                    continue
                if cat == "Trace":
                    raw.trace_window = (ts, end)
            elif ph == "i" or ph == "I":
                if e.get("name") != "[memory]":
                    continue
                args = e.get("args") or {}
                try:
                    dev = (int(args.get("Device Type", 0)), int(args.get("Device Id", 0)))
                    ts = float(e["ts"])
                    alloc = int(args.get("Total Allocated", 0))
                    reserved = int(args.get("Total Reserved", 0))
                    nbytes = int(args.get("Bytes", 0))
                except (KeyError, TypeError, ValueError):
                    continue
                series = raw.mem.get(dev)
                if series is None:
                    series = raw.mem[dev] = (array("d"), array("q"), array("q"))
                    raw.mem_live[dev] = {}
                series[0].append(ts)
                series[1].append(alloc)
                series[2].append(reserved)
                addr = args.get("Addr")
                if isinstance(addr, int):
                    live = raw.mem_live[dev]
                    if nbytes > 0:
                        live[addr] = (ts, nbytes, _thread_key(e.get("pid"), e.get("tid")))
                    elif nbytes < 0:
                        live.pop(addr, None)
    raw.events += counts.get("skipped", 0)
    return raw
