"""Memory snapshots in PyTorch's own schema (torch.cuda.memory._snapshot), for CUDA and CPU.

CUDA: the caching allocator's snapshot, made plain (tuples -> lists). CPU: the same schema
built from live storages (one segment per storage, one ``active_allocated`` block, device 0),
or from the profiler's ``[memory]`` events (``device_traces``), so that our report and
memory_viz read both alike. Every snapshot carries a top-level ``flight_profiler`` key:
{device_type, pid, time, label}.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import warnings
from typing import Any

from .gc_walk import live_instances
from .torch_support import plain

_LARGE = 1 << 20  # the CUDA allocator's small/large pool boundary


def meta(device_type: str, label: str, **extra: Any) -> dict[str, Any]:
    return {"device_type": device_type, "pid": os.getpid(), "time": time.time(), "label": label, **extra}


def cpu_snapshot(torch: Any, label: str) -> dict[str, Any]:
    """Segments = the live CPU storages reachable from Python tensors."""
    storages: dict[int, int] = {}
    tensor_type = torch.Tensor
    was = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for o in live_instances(tensor_type):
                try:
                    if o.device.type != "cpu" or o.layout != torch.strided:
                        continue
                    st = o.untyped_storage()
                    ptr, size = st.data_ptr(), st.nbytes()
                except Exception:
                    continue
                if ptr and size:
                    storages[ptr] = size
            o = None
    finally:
        if was:
            gc.enable()
    segments = []
    for ptr, size in sorted(storages.items()):
        segments.append({
            "device": 0, "address": ptr, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "large" if size >= _LARGE else "small", "segment_pool_id": [0, 0],
            "is_expandable": False, "frames": [],
            "blocks": [{"address": ptr, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": []}],
        })
    return {"segments": segments, "device_traces": [[]], "allocator_settings": {},
            "flight_profiler": meta("cpu", label, source="live tensors")}


def cuda_snapshot(torch: Any, label: str) -> dict[str, Any]:
    """The caching allocator's own snapshot (thin layer; not verified on hardware here)."""
    raw = plain(torch.cuda.memory._snapshot())
    # legacy: a bare list of segments
    snap: dict[str, Any] = {"segments": raw, "device_traces": []} if isinstance(raw, list) else raw
    snap.setdefault("device_traces", [])
    snap.setdefault("allocator_settings", {})
    snap["flight_profiler"] = meta("cuda", label, source="allocator", history=has_stacks(snap))
    return snap


def has_stacks(snap: dict[str, Any]) -> bool:
    """True when the snapshot carries allocation stacks (history recording was on)."""
    if any(trace for trace in snap.get("device_traces") or []):
        return True
    for seg in snap.get("segments") or []:
        for block in seg.get("blocks") or []:
            if block.get("frames") or block.get("history"):
                return True
    return False


def trim_traces(snap: dict[str, Any], since_us: float, until_us: float) -> int:
    """Keep only trace entries inside the recording window; returns how many remain."""
    kept = 0
    traces = []
    for trace in snap.get("device_traces") or []:
        window = [e for e in trace if since_us <= float(e.get("time_us", since_us)) <= until_us]
        kept += len(window)
        traces.append(window)
    snap["device_traces"] = traces
    return kept


# -- CPU: profiler memory events -> device_traces -------------------------------------------


# Python frames kept per allocation, innermost first (deeper stacks are cut there).
MAX_FRAMES = 64

Frame = dict[str, Any]
FrameKey = tuple[str, int, str]


class FrameTable:
    """The Python stacks of the allocations of one profiler event tree, built top-down.

    An allocation's stack is its nearest PyCall ancestor's call site, then the caller of that
    PyCall and of every PyCall above it: the same for every allocation under one PyCall. Built
    once per PyCall (not by walking each allocation's ancestors: one LBFGS step makes 17,000
    allocations under ~11 frames each, and 3 steps took 4-5 s of the recording) and shared: equal frames are one
    dict and the allocations under one PyCall share one list, which the pickle then writes once
    (and the report reads once). One table may serve several sessions of one recording.
    """

    def __init__(self) -> None:
        self._interned: dict[FrameKey, Frame] = {}

    def frame(self, state: Any) -> Frame | None:
        """One {filename, line, name} from a profiler _PyFrameState, or None if unreadable.

        Reading these strings can raise UnicodeDecodeError (the same failure that breaks
        ``key_averages()`` under with_stack once a DataLoader ran): such frames are dropped.
        """
        try:
            key = (str(state.file_name), int(state.line_number), str(state.function_name))
        except Exception:
            return None
        found = self._interned.get(key)
        if found is None:
            found = self._interned[key] = {"filename": key[0], "line": key[1], "name": key[2]}
        return found


class _Context:
    """What the allocations under one PyCall see: its call site, and the callers above it."""

    __slots__ = ("_stack", "callers", "callsite")

    def __init__(self, callsite: Frame | None, callers: tuple[Frame | None, ...]) -> None:
        self.callsite = callsite
        self.callers = callers  # this PyCall's caller first, then its ancestors' callers
        self._stack: list[Frame] | None = None

    def stack(self) -> list[Frame]:
        if self._stack is None:
            raw = (self.callsite, *self.callers)[:MAX_FRAMES]
            out: list[Frame] = []
            for f in raw:
                if f is None or f["filename"].startswith("<flight_profiler"):
                    continue
                if out and out[-1] == f:
                    continue
                out.append(f)
            self._stack = out
        return self._stack


def _enter_py_call(node: Any, outer: _Context | None, frames: FrameTable) -> _Context | None:
    """The context of the allocations under PyCall ``node`` (``outer``'s if it is unreadable)."""
    try:
        fields = node.typed[1]
    except Exception:
        fields = None
    if fields is None:
        return outer
    caller = frames.frame(getattr(fields, "caller", None))
    callers = (caller, *outer.callers[:MAX_FRAMES - 2]) if outer is not None else (caller,)
    return _Context(frames.frame(getattr(fields, "callsite", None)), callers)


def events_from_profiler(prof: Any, frames: FrameTable | None = None
                         ) -> tuple[list[dict[str, Any]], bool]:
    """(trace entries, frames_known) from a stopped torch.profiler run with profile_memory.

    Uses the profiler's event tree (allocation events with their Python ancestors); when that
    private API is missing, falls back to the exported Chrome trace's ``[memory]`` events
    without frames.
    """
    try:
        from_tree = _events_from_tree(prof, FrameTable() if frames is None else frames)
        if from_tree is not None:
            return from_tree, True
    except Exception:
        pass
    return _events_from_chrome(prof), False


def _events_from_tree(prof: Any, frames: FrameTable) -> list[dict[str, Any]] | None:
    torch = sys.modules.get("torch")
    event_type = getattr(getattr(getattr(torch, "_C", None), "_profiler", None), "_EventType", None)
    if event_type is None:
        return None
    allocation, py_call = event_type.Allocation, event_type.PyCall
    roots = prof.profiler.kineto_results.experimental_event_tree()
    no_frames: list[Frame] = []
    out: list[dict[str, Any]] = []
    stack: list[tuple[Any, _Context | None]] = [(root, None) for root in roots]
    while stack:
        node, context = stack.pop()
        tag = node.tag
        if tag == py_call:
            context = _enter_py_call(node, context, frames)
        children = node.children
        if children:
            stack.extend([(child, context) for child in children])
        if tag != allocation:
            continue
        fields = node.typed[1]
        if str(fields.device.type) != "cpu":
            continue
        size = int(fields.alloc_size)
        entry = {"addr": int(fields.ptr), "size": abs(size), "stream": 0,
                 "time_us": node.start_time_ns / 1000.0,
                 "frames": context.stack() if context is not None else no_frames,
                 "total_allocated": int(fields.total_allocated)}
        if size >= 0:
            out.append({"action": "alloc", **entry})
        else:
            out.append({"action": "free_requested", **entry})
            out.append({"action": "free_completed", **entry})
    out.sort(key=lambda e: e["time_us"])
    return out


def _events_from_chrome(prof: Any) -> list[dict[str, Any]]:
    import json
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".fp-mem-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as f:
            trace = json.load(f)
    finally:
        os.unlink(tmp)
    out = []
    base_us = float(trace.get("baseTimeNanoseconds", 0)) / 1000.0
    for e in trace.get("traceEvents", []):
        if e.get("name") != "[memory]":
            continue
        args = e.get("args", {})
        if args.get("Device Type", 0) != 0:
            continue
        size = int(args.get("Bytes", 0))
        entry = {"addr": int(args.get("Addr", 0)), "size": abs(size), "stream": 0,
                 "time_us": base_us + float(e.get("ts", 0)), "frames": [],
                 "total_allocated": int(args.get("Total Allocated", 0))}
        if size >= 0:
            out.append({"action": "alloc", **entry})
        else:
            out.append({"action": "free_requested", **entry})
            out.append({"action": "free_completed", **entry})
    return out


def from_trace_events(events: list[dict[str, Any]], label: str, frames_known: bool,
                      calls: int) -> dict[str, Any]:
    """A snapshot whose device_traces hold ``events``; segments = what was still allocated at
    the end of the recording (allocated during it and not freed), each with its stack."""
    live: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    segments = []
    for addr, e in sorted(live.items()):
        size = e["size"]
        segments.append({
            "device": 0, "address": addr, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "large" if size >= _LARGE else "small", "segment_pool_id": [0, 0],
            "is_expandable": False, "frames": e["frames"],
            "blocks": [{"address": addr, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": e["frames"]}],
        })
    return {"segments": segments, "device_traces": [events], "allocator_settings": {},
            "flight_profiler": meta("cpu", label, source="profiler memory events", calls=calls,
                                    frames=frames_known)}
