"""``torch memory``: allocator summary, ``-s`` snapshot, ``--record-history``, ``-r`` record.

args: mode ("summary"|"snapshot"|"history"|"record"), path/default_dir, label, history
("on"|"off"), max_entries, target (module/class/method/nested), calls, timeout.
CUDA branches are thin layers over torch.cuda's documented/ubiquitous APIs and are tested with
schema-faithful fakes only (no GPU here); CPU branches are verified on real processes.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from .. import call_window, cuda_history, memory_snapshot
from ..profiler_sessions import PerCall, release
from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..safepoint import at_safe_point
from ..torch_support import (
    check_writable,
    cuda_in_use,
    file_result,
    fmt_bytes,
    get_torch,
    output_path,
    plain,
    rss_bytes,
    write_pickle,
)

_RECORD_HINT = "run `torch memory --record-history on`, let the job allocate, then snapshot again"
DEFAULT_MAX_ENTRIES = 100_000


def handle_memory(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    mode = str(ctx.arg("mode", "summary"))
    if mode == "summary":
        # Reads every live tensor: in the main thread, between bytecodes (see safepoint.py).
        summary: dict[str, Any] = at_safe_point(ctx, lambda: _summary(torch), "torch memory")
        return summary
    if mode == "snapshot":
        return _snapshot(ctx, torch)
    if mode == "history":
        return _history(ctx, torch)
    if mode == "record":
        return _record(ctx, torch)
    raise CommandError(f"unknown torch memory mode {mode!r}", "use -s, -r or --record-history", ERR_USAGE)


def _allocator_settings(torch: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        name: os.environ[name]
        for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
        if name in os.environ
    }
    with contextlib.suppress(Exception):
        settings["backend"] = str(torch.cuda.get_allocator_backend())
    return settings


def _summary(torch: Any) -> dict[str, Any]:
    from ..tensor_census import _storage  # small helper shared with the census

    result: dict[str, Any] = {"mode": "summary", "rss_bytes": rss_bytes(), "cuda": cuda_in_use(torch),
                              "devices": [], "allocator_settings": {}}
    if result["cuda"]:
        for i in range(torch.cuda.device_count()):
            allocated = int(torch.cuda.memory_allocated(i))
            reserved = int(torch.cuda.memory_reserved(i))
            result["devices"].append({
                "device": f"cuda:{i}", "allocated": allocated, "reserved": reserved,
                "peak_allocated": int(torch.cuda.max_memory_allocated(i)),
                "peak_reserved": int(torch.cuda.max_memory_reserved(i)),
                "fragmentation": reserved - allocated,
            })
        result["allocator_settings"] = _allocator_settings(torch)
    # Live tensor bytes by device (storages counted once), for CPU and any other device.
    by_device: dict[str, dict[str, int]] = {}
    seen: set[Any] = set()
    for t in _live_tensors(torch):
        try:
            info = _storage(torch, t)
        except Exception:
            continue
        if info is None:
            continue
        entry = by_device.setdefault(info[0], {"count": 0, "bytes": 0})
        entry["count"] += 1
        if (info[0], info[1]) not in seen:
            seen.add((info[0], info[1]))
            entry["bytes"] += info[2]
    result["tensors_by_device"] = by_device
    return result


def _live_tensors(torch: Any) -> list[Any]:
    import gc
    import warnings

    tensor_type = torch.Tensor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        memo: dict[type, bool] = {}
        out = []
        for o in gc.get_objects():
            t = type(o)
            hit = memo.get(t)
            if hit is None:
                hit = memo[t] = issubclass(t, tensor_type)
            if hit:
                out.append(o)
        return out


def _snapshot(ctx: Context, torch: Any) -> dict[str, Any]:
    path = output_path(ctx.args, "memory", "pickle")
    check_writable(path)
    label = str(ctx.arg("label", "") or "")
    if cuda_in_use(torch):
        snap = memory_snapshot.cuda_snapshot(torch, label)
    else:
        snap = at_safe_point(ctx, lambda: memory_snapshot.cpu_snapshot(torch, label),
                             "CPU memory snapshot")
    size = write_pickle(path, snap)
    fp = snap["flight_profiler"]
    segments = snap.get("segments") or []
    total = sum(int(s.get("total_size", 0)) for s in segments)
    active = sum(int(s.get("active_size", s.get("allocated_size", 0))) for s in segments)
    result = {**file_result(path, size), "mode": "snapshot", "device_type": fp["device_type"],
              "segments": len(segments), "reserved_bytes": total, "active_bytes": active,
              "trace_entries": sum(len(t) for t in snap.get("device_traces") or []),
              "notes": []}
    if fp["device_type"] == "cuda" and not fp.get("history"):
        result["notes"].append(f"allocation stacks are missing (history recording is off): {_RECORD_HINT}")
    if fp["device_type"] == "cpu":
        result["notes"].append(
            "CPU target: segments are the live tensor storages (no allocator on CPU); "
            "stacks are only known for `torch memory -r`")
    del snap
    return result


def _history(ctx: Context, torch: Any) -> dict[str, Any]:
    on = str(ctx.arg("history", "on")) == "on"
    if not cuda_in_use(torch):
        raise CommandError(
            "allocation history recording is CUDA-only (the CUDA caching allocator records it)",
            "on a CPU target use `torch memory -r module [class] method`, which records "
            "allocations with Python stacks through the profiler", ERR_USAGE)
    max_entries = int(ctx.arg("max_entries") or DEFAULT_MAX_ENTRIES)
    if on:
        cuda_history.switch_on(torch, max_entries)
    else:
        cuda_history.switch_off(torch)
    return {"mode": "history", "recording": on, "max_entries": max_entries if on else None,
            "note": ("later snapshots carry allocation stacks; recording costs a little time per "
                     "allocation and a ring buffer of max_entries entries"
                     if on else "recording stopped")}


def _record(ctx: Context, torch: Any) -> dict[str, Any]:
    spec = ctx.arg("target")
    if not isinstance(spec, dict):
        raise CommandError("torch memory -r needs `module [class] method`", "", ERR_USAGE)
    path = output_path(ctx.args, "memory-record", "pickle")
    check_writable(path)
    calls = int(ctx.arg("calls", 1) or 1)
    timeout = float(ctx.arg("timeout", 60.0) or 60.0)
    label = str(ctx.arg("label", "") or "")
    if cuda_in_use(torch):
        snap, info = _record_cuda(ctx, torch, spec, calls, timeout, label)
    else:
        snap, info = _record_cpu(ctx, torch, spec, calls, timeout, label)
    size = write_pickle(path, snap)
    events = sum(len(t) for t in snap["device_traces"])
    allocs = [e for t in snap["device_traces"] for e in t if e.get("action") == "alloc"]
    top = _top_sites(allocs)
    surviving = sum(int(s.get("total_size", 0)) for s in snap.get("segments") or [])
    del snap
    return {**file_result(path, size), "mode": "record", **info, "trace_entries": events,
            "allocations": len(allocs), "allocated_bytes": sum(int(e.get("size", 0)) for e in allocs),
            "surviving_bytes": surviving, "top_sites": top,
            "summary": f"{len(allocs)} allocations ({fmt_bytes(sum(int(e.get('size', 0)) for e in allocs))}) "
                       f"in {info['calls_recorded']} calls"}


def _budget(ctx: Context) -> float:
    """Seconds the recorded calls may take in all (``budget``, 0: none; see record_calls)."""
    try:
        return max(0.0, float(ctx.arg("budget", 0.0) or 0.0))
    except (TypeError, ValueError):
        return 0.0


def _site_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The frame to name an allocation by: the innermost Python frame outside torch, else the
    innermost Python frame, else the first. CUDA history recorded with context "all" puts the
    C++ frames first (`??:0 torch::unwind::unwind()`, seen on an H100 with torch 2.11)."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    outside = [f for f in python if "/torch/" not in str(f.get("filename", ""))
               and not str(f.get("filename", "")).startswith("torch/")]
    for candidates in (outside, python, frames):
        if candidates:
            return candidates[0]
    return None


def _top_sites(allocs: list[dict[str, Any]], n: int = 8) -> list[dict[str, Any]]:
    sites: dict[str, list[int]] = {}
    for e in allocs:
        user = _site_frame(e.get("frames") or [])
        key = f"{user['filename']}:{user['line']} {user['name']}" if user else "?"
        entry = sites.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += int(e.get("size", 0))
    rows: list[dict[str, Any]] = [{"site": k, "count": c, "bytes": b} for k, (c, b) in sites.items()]
    rows.sort(key=lambda r: -int(r["bytes"]))
    return rows[:n]


def _record_cpu(ctx: Context, torch: Any, spec: dict[str, Any], calls: int, timeout: float,
                label: str) -> tuple[dict[str, Any], dict[str, Any]]:
    profiler = torch.profiler
    per_call = PerCall(torch, {"activities": [profiler.ProfilerActivity.CPU], "profile_memory": True,
                               "with_stack": True})
    try:
        info = call_window.record_calls(ctx, spec, calls, timeout, per_call.start, per_call.stop,
                                        what="memory recording", budget=_budget(ctx))
    finally:
        profs = per_call.finish()
    events: list[dict[str, Any]] = []
    frames_known = True
    table = memory_snapshot.FrameTable()  # equal frames and stacks shared across the calls
    try:
        while profs:
            prof = profs.pop(0)
            more, known = memory_snapshot.events_from_profiler(prof, table)
            release(prof)
            del prof
            events += more
            frames_known = frames_known and known
    finally:
        del profs
    events.sort(key=lambda e: float(e["time_us"]))
    snap = memory_snapshot.from_trace_events(events, label, frames_known, info["calls_recorded"])
    return snap, info


def _record_cuda(ctx: Context, torch: Any, spec: dict[str, Any], calls: int, timeout: float,
                 label: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Allocator history around the calls; the previous recording state is restored.

    Not verified on hardware here (tested with schema-faithful fakes).
    """
    memory = torch.cuda.memory
    max_entries = int(ctx.arg("max_entries") or DEFAULT_MAX_ENTRIES)
    window: dict[str, float] = {}
    was_recording = memory_snapshot.has_stacks(plain(memory._snapshot()))

    def start(index: int) -> None:
        window.setdefault("start", time.time() * 1e6)

    def stop(index: int) -> None:
        window["end"] = time.time() * 1e6

    # History is switched on and off by one agent thread (cuda_history.py: torch keeps its
    # annotation callback in the thread that switches it on), never from the hook in the
    # target's thread. The entries before the first call are trimmed below.
    if not was_recording:
        cuda_history.switch_on(torch, max_entries)
    try:
        info = call_window.record_calls(ctx, spec, calls, timeout, start, stop, what="memory recording",
                                        budget=_budget(ctx))
        snap = memory_snapshot.cuda_snapshot(torch, label)
    finally:
        if not was_recording:
            cuda_history.switch_off(torch)
    memory_snapshot.trim_traces(snap, window.get("start", 0.0), window.get("end", time.time() * 1e6))
    snap["flight_profiler"]["calls"] = info["calls_recorded"]
    return snap, info
