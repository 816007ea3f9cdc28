"""Read one ``event.json`` an armed trigger wrote (agent/triggers/evidence.py), defensively:
the file sits in a directory the job's user can write, so every field is checked for its type
and anything odd is dropped, not trusted."""

from __future__ import annotations

import json
import os
from typing import Any

FORMAT = "flight_profiler.arm_event"
KINDS = ("hang", "nan", "oom", "slow")


class ArmEventFormatError(ValueError):
    pass


def _frame(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    file, line, function = value.get("file"), value.get("line"), value.get("function")
    if not isinstance(file, str) or not isinstance(function, str):
        return None
    return {"file": file[:1000], "function": function[:400],
            "line": line if isinstance(line, int) and not isinstance(line, bool) else None}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any, limit: int = 2000) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _param(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    shape = value.get("shape")
    return {"name": _text(value.get("name"), 400), "group": _int(value.get("group")),
            "index": _int(value.get("index")),
            "shape": [s for s in shape if isinstance(s, int)][:16] if isinstance(shape, list) else [],
            "nonfinite": _int(value.get("nonfinite_grad_elements")),
            "elements": _int(value.get("grad_elements")),
            "param_finite": value.get("param_finite") if isinstance(value.get("param_finite"), bool) else None}


def _op(value: Any) -> dict[str, Any] | None:
    """One op the NaN locator named (agent/nan_watch.py's record)."""
    if not isinstance(value, dict):
        return None
    stack = value.get("forward_stack")
    finite = value.get("inputs_finite")
    from_param = value.get("nonfinite_input_is_parameter")
    return {"op": _text(value.get("op"), 200) or "?", "phase": _text(value.get("phase"), 20),
            "backward_node": _text(value.get("backward_node"), 200),
            "inputs_finite": finite if isinstance(finite, bool) else None,
            "from_parameter": from_param if isinstance(from_param, bool) else None,
            "nan": _int(value.get("nan")), "inf": _int(value.get("inf")),
            "stack": [str(x)[:600] for x in stack[-12:]] if isinstance(stack, list) else []}


def _located(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    return {"step": _int(value.get("step")), "watched": value.get("watched") is True,
            "found": value.get("found") is True, "reason": _text(value.get("reason"), 400),
            "cut_short": _text(value.get("cut_short"), 400), "ops_checked": _int(value.get("ops_checked")),
            "origin": _op(value.get("origin")), "first_nonfinite": _op(value.get("first_nonfinite"))}


def _dict(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _list(raw: dict[str, Any], key: str) -> list[Any]:
    value = raw.get(key)
    return value if isinstance(value, list) else []


def parse_event(text: str, path: str = "") -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ArmEventFormatError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ArmEventFormatError("not an arm event (no format key)")
    kind = raw.get("trigger")
    if kind not in KINDS:
        raise ArmEventFormatError(f"unknown trigger {str(kind)[:40]!r}")
    rank, files, params = _dict(raw, "rank"), _dict(raw, "files"), _dict(raw, "params")
    profiled = [v for v in (_num(x) for x in _list(raw, "profiled_step_s")[:100]) if v is not None]
    threads, traceback = _list(raw, "threads"), _list(raw, "traceback")
    first, top, dropped = _list(raw, "first_params"), _list(raw, "census_top"), _list(raw, "dropped")
    return {
        "kind": kind, "dir": os.path.dirname(path), "pid": _int(raw.get("pid")),
        "time": _num(raw.get("time")), "rank": _int(rank.get("rank")),
        "world_size": _int(rank.get("world_size")), "step": _int(raw.get("step")),
        "where": _frame(raw.get("where")), "files": sorted(str(f)[:200] for f in files)[:50],
        "dropped": len(dropped),
        "capture_error": _text(raw.get("capture_error")),
        # hang
        "stalled_s": _num(raw.get("stalled_s")), "fr": _text(raw.get("fr")),
        "threads": [{"thread": _text(t.get("thread"), 200), "where": _frame(t.get("where")),
                     "inner": [f for f in (_frame(v) for v in _list(t, "frames")[-12:]) if f is not None]}
                    for t in threads[:20] if isinstance(t, dict)],
        "seconds": _num(params.get("seconds")),
        # nan
        "clean_at_step": _int(raw.get("clean_at_step")), "checked_every": _int(raw.get("checked_every")),
        "params_hit": _int(raw.get("params_hit")), "params_checked": _int(raw.get("params_checked")),
        "first_params": [p for p in (_param(v) for v in first[:20]) if p is not None],
        "located": _located(raw.get("located")),
        # oom
        "signal": _text(raw.get("signal"), 40), "error": _text(raw.get("error")),
        "rss_bytes": _int(raw.get("rss_bytes")), "rss_limit": _int(raw.get("rss_limit")),
        "alloc_bytes": _int(raw.get("alloc_bytes")), "device": _int(raw.get("device")),
        "traceback": [f for f in (_frame(v) for v in traceback[-20:]) if f is not None],
        "census_top": [{"path": _text(h.get("path"), 400), "bytes": _int(h.get("bytes"))}
                       for h in top[:5] if isinstance(h, dict)],
        # slow
        "slow_step": _int(raw.get("slow_step")), "slow_step_s": _num(raw.get("slow_step_s")),
        "median_s": _num(raw.get("median_s")), "factor": _num(raw.get("factor")),
        "steps_wanted": _int(raw.get("steps_wanted")), "profiled_step_s": profiled,
        "timed_out": raw.get("timed_out") is True,
        "started_after_s": _num(raw.get("profile_started_after_s")),
        "trace": os.path.basename(_text(raw.get("trace"), 200) or "") or None,
    }
