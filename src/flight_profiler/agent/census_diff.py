"""What grew between two tensor censuses, by holder and by group.

Holders match by canonical path (``__main__.losses[*]``), groups by (device, dtype, shape).
Both documents are plain data (the previous one was read from JSON by the CLI); nothing here
touches a tensor.
"""

from __future__ import annotations

from typing import Any

_FIELDS = ("count", "bytes", "with_grad_fn", "graph_bytes")


def _index(rows: Any, key: Any) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict):
            try:
                out[key(row)] = row
            except (KeyError, TypeError):
                continue
    return out


def _delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int]:
    d: dict[str, int] = {}
    for f in _FIELDS:
        a = int((after or {}).get(f, 0) or 0)
        b = int((before or {}).get(f, 0) or 0)
        d[f + "_before"] = b
        d[f + "_after"] = a
        d[f + "_delta"] = a - b
    return d


def _rows(prev: dict[Any, dict[str, Any]], cur: dict[Any, dict[str, Any]], describe: Any,
          top: int) -> list[dict[str, Any]]:
    rows = []
    for key in set(prev) | set(cur):
        d = _delta(prev.get(key), cur.get(key))
        if d["count_delta"] == 0 and d["bytes_delta"] == 0 and d["graph_bytes_delta"] == 0:
            continue
        rows.append({**describe(key, cur.get(key) or prev.get(key) or {}), **d})
    rows.sort(key=lambda r: (-(r["bytes_delta"] + r["graph_bytes_delta"]), -r["count_delta"]))
    return rows[:top]


def diff(previous: dict[str, Any], current: dict[str, Any], top: int = 20) -> dict[str, Any]:
    """Growth from ``previous`` to ``current``; biggest growth first (shrinks last)."""
    ph = _index(previous.get("holders"), lambda r: str(r["path"]))
    ch = _index(current.get("holders"), lambda r: str(r["path"]))
    pg = _index(previous.get("groups"), lambda r: (r["device"], r["dtype"], tuple(r["shape"])))
    cg = _index(current.get("groups"), lambda r: (r["device"], r["dtype"], tuple(r["shape"])))
    seconds = None
    if isinstance(previous.get("time"), (int, float)) and isinstance(current.get("time"), (int, float)):
        seconds = round(float(current["time"]) - float(previous["time"]), 3)
    return {
        "previous_label": previous.get("label", ""),
        "previous_pid": previous.get("pid"),
        "same_process": previous.get("pid") == current.get("pid"),
        "seconds_between": seconds,
        "totals": _delta(previous.get("totals"), current.get("totals")),
        "holders": _rows(ph, ch, lambda k, r: {"path": k, "example": r.get("example", k),
                                                "kind": r.get("kind", "")}, top),
        "groups": _rows(pg, cg, lambda k, r: {"device": k[0], "dtype": k[1], "shape": list(k[2])}, top),
    }
