"""Memory snapshots (torch.cuda.memory._snapshot schema, its legacy forms, our CPU form).

Normalised to plain figures: per-device reserved / allocated / active / inactive bytes, the
largest free block, inactive split blocks, live allocations grouped by the user's stack frame,
OOM events from ``device_traces``, and the allocator settings.
"""

from __future__ import annotations

import math
from typing import IO, Any

from flight_profiler.report.safe_pickle import safe_loads

_LIB_PARTS = ("/torch/", "site-packages/", "dist-packages/", "<frozen", "/lib/python3",
              "threading.py", "runpy.py", "flight_profiler/agent")


MAX_FRAMES = 256
# Blocks visited in all: a pickle can make every segment refer to one shared block list, so
# the work would grow with the product of two counts while the file stays small.
MAX_BLOCKS = 20_000_000


class SnapshotFormatError(ValueError):
    pass


def _frames(block: dict[str, Any]) -> list[dict[str, Any]]:
    frames = block.get("frames")
    if not frames:
        hist = block.get("history")
        if isinstance(hist, list) and hist and isinstance(hist[-1], dict):
            frames = hist[-1].get("frames")
    return frames if isinstance(frames, list) else []


def site_of(frames: list[dict[str, Any]]) -> str:
    """The innermost frame in the user's own Python code, as file:line (function)."""
    fallback = None
    # Deeper than this is recursion or a hostile file whose blocks all share one huge stack.
    for f in frames[:MAX_FRAMES]:
        if not isinstance(f, dict):
            continue
        fn = str(f.get("filename", ""))
        if not fn.endswith(".py"):
            continue
        where = f"{fn}:{f.get('line', '?')} ({f.get('name', '?')})"
        if fallback is None:
            fallback = where
        if not any(part in fn for part in _LIB_PARTS):
            return where
    return fallback or "(no stack recorded)"


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


_MAX_BYTES = 1 << 62  # no device holds more; a bigger "size" would overflow every figure


def _int(v: Any, what: str, high: int = _MAX_BYTES) -> int:
    """A count or a byte count of the snapshot (absent: 0); else SnapshotFormatError."""
    if not v:
        return 0
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError):
        raise SnapshotFormatError(f"{what} is not a number ({type(v).__name__})") from None
    if not -high <= n < high:
        raise SnapshotFormatError(f"{what} is out of range (a {n.bit_length()}-bit integer)")
    return n


def _scalar(v: Any) -> Any:
    """A value passed through to the report as it is: a short string, a bool, a finite number
    (else None): nothing deep, huge or non-finite rides along into the report."""
    if isinstance(v, str):
        return v[:1000]
    if v is None or isinstance(v, bool) or (type(v) is int and abs(v) < _MAX_BYTES):
        return v
    return v if type(v) is float and math.isfinite(v) else None


def _flat(d: dict[Any, Any]) -> dict[str, Any]:
    """Allocator settings: scalars, and lists of them (roundup_power2_divisions)."""
    return {str(k)[:100]: [_scalar(x) for x in v[:64]] if isinstance(v, (list, tuple)) else _scalar(v)
            for k, v in list(d.items())[:64]}


def _expandable(settings: dict[str, Any]) -> bool | None:
    if "expandable_segments" in settings:
        return bool(settings["expandable_segments"])
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(conf, str) and conf:
        return "expandable_segments:true" in conf.replace(" ", "").lower()
    return None


def parse_snapshot(data: bytes | IO[bytes], path: str, mtime: float,
                   budget: int | None = None) -> dict[str, Any]:
    """Unpickle safely (under ``budget`` bytes of new address space) and normalise; raises
    SnapshotFormatError if it is not a snapshot."""
    obj = safe_loads(data, budget)
    if isinstance(obj, list):  # legacy: a bare list of segments
        obj = {"segments": obj, "device_traces": [], "allocator_settings": {}}
    if not isinstance(obj, dict) or "segments" not in obj or not isinstance(obj["segments"], list):
        raise SnapshotFormatError("a pickle, but not a memory snapshot (no 'segments' list)")
    fp = _dict(obj.get("flight_profiler"))
    settings = _flat(_dict(obj.get("allocator_settings")))
    device_type = str(fp.get("device_type", "cuda"))
    devices: dict[int, dict[str, Any]] = {}
    sites: dict[str, list[int]] = {}
    visited = 0
    for seg in obj["segments"]:
        if not isinstance(seg, dict):
            raise SnapshotFormatError("a segment is not a dict")
        dev = _int(seg.get("device"), "a segment's device", 1 << 16)
        d = devices.setdefault(dev, {
            "reserved": 0, "allocated": 0, "active": 0, "requested": 0, "segments": 0,
            "blocks": 0, "inactive_bytes": 0, "inactive_split_blocks": 0,
            "largest_free_block": 0, "expandable_segments_seen": False,
        })
        total = _int(seg.get("total_size"), "a segment's total_size")
        blocks = _list(seg.get("blocks"))
        d["reserved"] += total
        d["segments"] += 1
        if seg.get("is_expandable"):
            d["expandable_segments_seen"] = True
        alloc_here = 0
        visited += len(blocks) + 1
        if visited > MAX_BLOCKS:
            raise SnapshotFormatError(f"more than {MAX_BLOCKS} blocks: not a real snapshot")
        for b in blocks:
            if not isinstance(b, dict):
                continue
            size = _int(b.get("size"), "a block's size")
            state = str(b.get("state", ""))
            d["blocks"] += 1
            if state == "active_allocated":
                alloc_here += size
                req = b.get("requested_size")
                d["requested"] += _int(req, "a block's requested_size") if isinstance(req, int) else size
                s = sites.setdefault(f"{dev}|{site_of(_frames(b) or _frames(seg))}", [0, 0])
                s[0] += 1
                s[1] += size
            if state.startswith("active"):
                d["active"] += size
            elif state == "inactive":
                d["inactive_bytes"] += size
                if size > d["largest_free_block"]:
                    d["largest_free_block"] = size
                if len(blocks) > 1:
                    d["inactive_split_blocks"] += 1
        if not blocks:  # no block detail: trust the segment's own counters
            alloc_here = _int(seg.get("allocated_size"), "a segment's allocated_size")
            active = _int(seg.get("active_size", alloc_here), "a segment's active_size")
            d["active"] += active
            free = total - active
            d["inactive_bytes"] += max(0, free)
            d["largest_free_block"] = max(d["largest_free_block"], free)
            s = sites.setdefault(f"{dev}|{site_of(_frames(seg))}", [0, 0])
            s[0] += 1
            s[1] += alloc_here
        d["allocated"] += alloc_here
    ooms: list[dict[str, Any]] = []
    trace_counts: dict[str, int] = {}
    peaks: dict[int, int] = {}
    traces = _list(obj.get("device_traces"))
    for dev, entries in enumerate(traces):
        if not isinstance(entries, list):
            continue
        net = 0
        running: list[int] = []
        visited += len(entries) + 1
        if visited > MAX_BLOCKS:
            raise SnapshotFormatError(f"more than {MAX_BLOCKS} blocks and events: not a real snapshot")
        for ent in entries:
            if not isinstance(ent, dict):
                continue
            action = str(ent.get("action", ""))[:100]
            if action not in trace_counts and len(trace_counts) >= 64:
                action = "(other)"  # torch has about ten actions
            trace_counts[action] = trace_counts.get(action, 0) + 1
            size = _int(ent.get("size"), "a trace entry's size")
            if action == "alloc":
                net += size
            elif action == "free_completed":
                net -= size
            running.append(net)
            if action == "oom" and len(ooms) < 100:
                ooms.append({
                    "device": dev, "requested": size,
                    "device_free": _int(ent.get("device_free"), "an oom's device_free"),
                    "time_us": _scalar(ent.get("time_us")), "stream": _scalar(ent.get("stream")),
                    "where": site_of(ent.get("frames") or []),
                })
        if running and dev in devices:
            # Replay backwards from the state at snapshot time to the peak inside the window.
            start = devices[dev]["allocated"] - net
            peaks[dev] = start + max(0, max(running))
    for dev, d in devices.items():
        d["peak_allocated_in_trace"] = max(peaks.get(dev, 0), d["allocated"])
        d["reserved_to_allocated"] = round(d["reserved"] / d["allocated"], 3) if d["allocated"] else None
    top = sorted(sites.items(), key=lambda kv: -kv[1][1])
    pid, when, label = fp.get("pid"), fp.get("time"), fp.get("label")
    has_time = ((type(when) is float and math.isfinite(when))
                or (type(when) is int and abs(when) < 1 << 53))
    return {
        "kind": "snapshot",
        "device_type": device_type[:40],
        "pid": pid if type(pid) is int and 0 <= pid < 1 << 32 else None,
        "time": float(when) if has_time and when is not None else mtime,
        "time_source": "flight_profiler.time" if has_time else "mtime",
        "label": label[:200] if isinstance(label, str) else None,
        # `torch memory -r`: allocations during N calls, not the process's memory at a moment.
        "recorded_calls": fp.get("calls") if type(fp.get("calls")) is int else None,
        "devices": {str(k): v for k, v in sorted(devices.items())},
        "allocated": sum(d["allocated"] for d in devices.values()),
        "reserved": sum(d["reserved"] for d in devices.values()),
        "sites": [{"device": int(k.split("|", 1)[0]), "site": k.split("|", 1)[1], "count": v[0],
                   "bytes": v[1]} for k, v in top[:50]],
        "ooms": ooms,
        "trace_actions": trace_counts,
        "allocator_settings": settings,
        "expandable_segments": _expandable(settings),
    }
