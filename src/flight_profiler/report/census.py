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
    """A figure the report can add up and print: within int64 (1e308 is finite, but its sum
    with another is not)."""
    if type(v) is int:
        return -(1 << 63) <= v < 1 << 63
    return type(v) is float and math.isfinite(v) and abs(v) < 2.0 ** 63


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
    by_device = totals.get("by_device")
    holders = []
    for h in _list(obj, "holders"):
        if not isinstance(h, dict) or not isinstance(h.get("path"), str):
            raise CensusFormatError("a holder has no 'path'")
        row = {
            "path": h["path"][:1000], "example": str(h.get("example", h["path"]))[:1000],
            "kind": str(h.get("kind", "?"))[:100], "count": _int(h, "count"), "bytes": _int(h, "bytes"),
            "with_grad_fn": _int(h, "with_grad_fn"), "graph_bytes": _int(h, "graph_bytes"),
        }
        if h.get("root") in ROOTS:
            row["root"] = h["root"]
        for key in ("depth", "cap", "length", "kept", "sampled", "numel"):
            if key in h and h[key] is not None:
                row[key] = _int(h, key)
        if type(h.get("chained")) is bool:
            row["chained"] = h["chained"]
        holders.append(row)
    groups = [_flat(g) for g in _list(obj, "groups")[:50] if isinstance(g, dict)]
    sites = [_flat(s) for s in _list(obj, "sites") if isinstance(s, dict) and "site" in s][:50]
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
            "by_device": {str(k)[:100]: _flat(v) for k, v in list(by_device.items())[:64]
                          if isinstance(v, dict)} if isinstance(by_device, dict) else {},
        },
        "holders": holders,
        "groups": groups,
        "sites": sites,
        "skipped": _flat(obj["skipped"]) if isinstance(obj.get("skipped"), dict) else None,
        "census_id": _text(obj.get("census_id"), 64),
        "holders_complete": obj.get("holders_complete") is not False,
        "previous_id": _text(obj.get("previous_id"), 64),
        "moment": _text(obj.get("moment"), 300),
    }


def _text(v: Any, limit: int) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    v = obj.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise CensusFormatError(f"'{key}' is not a list")
    return v


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool)) or _finite(v)


def _flat(d: dict[str, Any]) -> dict[str, Any]:
    """The scalar fields of a row (and lists of scalars, e.g. a shape), strings cut: rows are
    passed through to the report as they are, so nothing deep or huge may ride along."""
    out: dict[str, Any] = {}
    for k, v in list(d.items())[:32]:
        if isinstance(v, list) and len(v) <= 64 and all(_scalar(x) for x in v):
            v = [x[:200] if isinstance(x, str) else x for x in v]
        elif not _scalar(v):
            continue
        out[str(k)[:100]] = v[:1000] if isinstance(v, str) else v
    return out
