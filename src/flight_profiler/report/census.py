"""Tensor censuses (``torch tensors`` output, format ``flight_profiler.census`` version 1).

Fields added later to version 1 are optional and read when present: per holder ``root``,
``depth``, ``cap`` / ``length``, ``kept`` / ``sampled`` / ``chained``; per census ``census_id``,
``previous_id`` and ``moment`` (docs/commands-torch.md). A census without them is judged as
before (census_growth.py says how)."""

from __future__ import annotations

import json
import math
from typing import Any

FORMAT = "flight_profiler.census"
VERSIONS = (1,)
ROOTS = ("global", "local", "return", "unreached")


class CensusFormatError(ValueError):
    pass


def _finite(v: Any) -> bool:
    if type(v) is int:
        return -(1 << 63) <= v < 1 << 63
    return type(v) is float and math.isfinite(v)


def _int(d: dict[str, Any], key: str) -> int:
    v = d.get(key, 0)
    if not _finite(v):
        raise CensusFormatError(f"field {key!r} is not a finite number")
    return int(v)


def _reject_constant(name: str) -> Any:
    raise CensusFormatError(f"{name} is not a number a census can hold")


def parse_census(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise CensusFormatError(f"invalid JSON at character {exc.pos}: {exc.msg}") from None
    except RecursionError:
        raise CensusFormatError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer over 4300 digits
        raise CensusFormatError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CensusFormatError("not a tensor census (no \"format\": \"flight_profiler.census\")")
    version = obj.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise CensusFormatError(f"census version {obj.get('version')!r} is not supported "
                                f"(this flight_profiler reads {VERSIONS})")
    totals = obj.get("totals")
    if not isinstance(totals, dict):
        raise CensusFormatError("missing 'totals'")
    holders = []
    for h in obj.get("holders") or []:
        if not isinstance(h, dict) or not isinstance(h.get("path"), str):
            raise CensusFormatError("a holder has no 'path'")
        row = {
            "path": h["path"][:1000], "example": str(h.get("example", h["path"]))[:1000],
            "kind": str(h.get("kind", "?"))[:100], "count": _int(h, "count"), "bytes": _int(h, "bytes"),
            "with_grad_fn": _int(h, "with_grad_fn"), "graph_bytes": _int(h, "graph_bytes"),
        }
        if h.get("root") in ROOTS:
            row["root"] = h["root"]
        for key in ("depth", "cap", "length", "kept", "sampled"):
            if key in h and h[key] is not None:
                row[key] = _int(h, key)
        if type(h.get("chained")) is bool:
            row["chained"] = h["chained"]
        holders.append(row)
    groups = [g for g in (obj.get("groups") or []) if isinstance(g, dict)]
    sites = [s for s in (obj.get("sites") or []) if isinstance(s, dict) and "site" in s]
    time = obj.get("time")
    pid = obj.get("pid")
    if pid is not None and (type(pid) is not int or not 0 <= pid < 1 << 32):
        raise CensusFormatError(f"'pid' is not a process id: {str(pid)[:40]!r}")
    label = obj.get("label")
    return {
        "kind": "census",
        "pid": pid,
        "time": float(time) if time is not None and _finite(time) else None,
        "label": label[:200] if isinstance(label, str) else None,
        "totals": {
            "count": _int(totals, "count"), "bytes": _int(totals, "bytes"),
            "with_grad_fn": _int(totals, "with_grad_fn"), "graph_bytes": _int(totals, "graph_bytes"),
            "by_device": totals.get("by_device") if isinstance(totals.get("by_device"), dict) else {},
        },
        "holders": holders,
        "groups": groups[:50],
        "sites": sites[:50],
        "skipped": obj.get("skipped") if isinstance(obj.get("skipped"), dict) else None,
        "census_id": _text(obj.get("census_id"), 64),
        "holders_complete": obj.get("holders_complete") is not False,
        "previous_id": _text(obj.get("previous_id"), 64),
        "moment": _text(obj.get("moment"), 300),
    }


def _text(v: Any, limit: int) -> str | None:
    return v[:limit] if isinstance(v, str) else None
