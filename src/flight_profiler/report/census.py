"""Tensor censuses (``torch tensors`` output, format ``flight_profiler.census`` version 1)."""

from __future__ import annotations

import json
from typing import Any

FORMAT = "flight_profiler.census"
VERSIONS = (1,)


class CensusFormatError(ValueError):
    pass


def _int(d: dict[str, Any], key: str) -> int:
    v = d.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CensusFormatError(f"field {key!r} is not a number")
    return int(v)


def parse_census(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CensusFormatError(f"invalid JSON at character {exc.pos}: {exc.msg}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CensusFormatError("not a tensor census (no \"format\": \"flight_profiler.census\")")
    if obj.get("version") not in VERSIONS:
        raise CensusFormatError(f"census version {obj.get('version')!r} is not supported "
                                f"(this flight_profiler reads {VERSIONS})")
    totals = obj.get("totals")
    if not isinstance(totals, dict):
        raise CensusFormatError("missing 'totals'")
    holders = []
    for h in obj.get("holders") or []:
        if not isinstance(h, dict) or not isinstance(h.get("path"), str):
            raise CensusFormatError("a holder has no 'path'")
        holders.append({
            "path": h["path"], "example": str(h.get("example", h["path"])),
            "kind": str(h.get("kind", "?")), "count": _int(h, "count"), "bytes": _int(h, "bytes"),
            "with_grad_fn": _int(h, "with_grad_fn"), "graph_bytes": _int(h, "graph_bytes"),
        })
    groups = [g for g in (obj.get("groups") or []) if isinstance(g, dict)]
    sites = [s for s in (obj.get("sites") or []) if isinstance(s, dict) and "site" in s]
    time = obj.get("time")
    return {
        "kind": "census",
        "pid": obj.get("pid"),
        "time": float(time) if isinstance(time, (int, float)) else None,
        "label": obj.get("label"),
        "totals": {
            "count": _int(totals, "count"), "bytes": _int(totals, "bytes"),
            "with_grad_fn": _int(totals, "with_grad_fn"), "graph_bytes": _int(totals, "graph_bytes"),
            "by_device": totals.get("by_device") if isinstance(totals.get("by_device"), dict) else {},
        },
        "holders": holders,
        "groups": groups[:50],
        "sites": sites[:50],
        "skipped": obj.get("skipped") if isinstance(obj.get("skipped"), dict) else None,
    }
