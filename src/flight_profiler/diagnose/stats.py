"""Numbers the workflow derives from watch and trace: the cost spread, where the time goes.

Inputs are the JSON the agent streams (one event per observed call); outputs are plain dicts that
go into diagnose.json and the report's extra sections.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

# A step whose slowest call is this many times its median has outliers worth a look (stalls,
# periodic work such as checkpointing or logging, GC pauses).
OUTLIER_RATIO = 3.0
# Coefficient of variation (stdev / mean) above which calls are called inconsistent.
INCONSISTENT_CV_PCT = 25.0

_COST_KEYS = ("cost_ms", "cost", "elapsed_ms", "duration_ms")
_NS_KEYS = ("cost_ns", "elapsed_ns")


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def cost_ms(event: dict[str, Any]) -> float | None:
    """The cost of one watched call, in ms, from a watch event (several shapes tolerated)."""
    for container in (event, event.get("values"), event.get("expr"), event.get("exprs")):
        if not isinstance(container, dict):
            continue
        for key in _COST_KEYS:
            v = _as_float(container.get(key))
            if v is not None:
                return v
        for key in _NS_KEYS:
            v = _as_float(container.get(key))
            if v is not None:
                return v / 1e6
    return None


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def spread(values_ms: Iterable[float]) -> dict[str, Any]:
    """Cost statistics of N calls and a one-line verdict on their consistency."""
    values = sorted(v for v in values_ms if v >= 0)
    if not values:
        return {"calls": 0, "verdict": "no calls observed"}
    mean = statistics.fmean(values)
    stdev = statistics.pstdev(values) if len(values) > 1 else 0.0
    median = statistics.median(values)
    cv = 100.0 * stdev / mean if mean > 0 else 0.0
    ratio = values[-1] / median if median > 0 else 0.0
    if len(values) < 3:
        verdict = f"only {len(values)} call(s): too few to judge consistency"
    elif ratio >= OUTLIER_RATIO:
        verdict = (f"outliers: the slowest call took {ratio:.1f}x the median "
                   f"({values[-1]:.3f} ms vs {median:.3f} ms)")
    elif cv >= INCONSISTENT_CV_PCT:
        verdict = f"inconsistent: costs vary by {cv:.0f}% (stdev/mean)"
    else:
        verdict = f"consistent: costs vary by {cv:.0f}% (stdev/mean)"
    return {
        "calls": len(values), "mean_ms": round(mean, 4), "median_ms": round(median, 4),
        "p90_ms": round(_percentile(values, 0.9), 4), "min_ms": round(values[0], 4),
        "max_ms": round(values[-1], 4), "stdev_ms": round(stdev, 4), "cv_pct": round(cv, 1),
        "max_over_median": round(ratio, 2), "verdict": verdict,
    }


# -- trace ----------------------------------------------------------------------------------------
_NAME_KEYS = ("name", "function", "func", "qualname")
_TIME_KEYS = ("total_ms", "cost_ms", "inclusive_ms", "ms", "elapsed_ms", "cost")


def _node_ms(node: dict[str, Any]) -> float | None:
    for key in _TIME_KEYS:
        v = _as_float(node.get(key))
        if v is not None:
            return v
    for key in ("total_ns", "cost_ns", "elapsed_ns"):
        v = _as_float(node.get(key))
        if v is not None:
            return v / 1e6
    return None


def _node_name(node: dict[str, Any]) -> str:
    name = next((str(node[k]) for k in _NAME_KEYS if node.get(k)), "?")
    where = node.get("file") or node.get("filename")
    line = node.get("line") or node.get("lineno")
    if where:
        short = str(where).rsplit("/", 1)[-1]
        return f"{name} ({short}:{line})" if line else f"{name} ({short})"
    return name


def _children(node: dict[str, Any]) -> list[dict[str, Any]]:
    kids = node.get("children") or node.get("calls") or []
    return [k for k in kids if isinstance(k, dict)]


def call_trees(payloads: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The root node of every traced call found in trace events / a trace result."""
    roots: list[dict[str, Any]] = []
    for payload in payloads:
        if not isinstance(payload, dict):
            continue
        for key in ("tree", "root", "call"):
            if isinstance(payload.get(key), dict):
                roots.append(payload[key])
                break
        else:
            trees = payload.get("trees") or payload.get("calls_traced")
            if isinstance(trees, list):
                roots.extend(t for t in trees if isinstance(t, dict))
            elif _children(payload) and _node_ms(payload) is not None:
                roots.append(payload)
    return roots


# A callee taking at least this share of its caller's time is a pass-through wrapper
# (Module.__call__ -> _call_impl -> forward): the chain is shown as one row.
CHAIN_SHARE = 0.9


def _merge(nodes: list[dict[str, Any]], into: dict[str, dict[str, Any]]) -> None:
    """Sum call trees by call path: {name: {"ms", "calls", "children": {...}}}."""
    for node in nodes:
        slot = into.setdefault(_node_name(node), {"ms": 0.0, "calls": 0, "children": {}})
        slot["ms"] += _node_ms(node) or 0.0
        slot["calls"] += int(node.get("count", 1) or 1)
        _merge(_children(node), slot["children"])


def _chain(name: str, slot: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Follow pass-through wrappers down to the callee that does the work."""
    names = [name]
    while slot["children"]:
        # Followed when one callee takes nearly all of the time (small siblings are then
        # hidden: each is under 10% of this row).
        child_name, child = max(slot["children"].items(), key=lambda kv: kv[1]["ms"])
        if slot["ms"] <= 0 or child["ms"] < CHAIN_SHARE * slot["ms"]:
            break
        names.append(child_name)
        slot = child
    label = names[0] if len(names) == 1 else f"{names[0]} > {names[-1]}"
    return label, slot


def where_time_goes(roots: list[dict[str, Any]], top: int = 12, depth: int = 3) -> dict[str, Any]:
    """Inclusive time by callee, summed over calls, as an indented tree of the costly paths.

    Rows are callees down to ``depth`` levels (wrapper chains count as one level), each with
    its share of the method's total time; callees under 1% are left out.
    """
    total = sum(_node_ms(r) or 0.0 for r in roots)
    merged: dict[str, dict[str, Any]] = {}
    for root in roots:
        _merge(_children(root), merged)
    child_total = sum(slot["ms"] for slot in merged.values())
    rows: list[dict[str, Any]] = []

    def emit(level: dict[str, dict[str, Any]], d: int) -> None:
        for name, slot in sorted(level.items(), key=lambda kv: -kv[1]["ms"]):
            if total <= 0 or 100.0 * slot["ms"] / total < 1.0 or len(rows) >= top:
                continue
            # A chain's row names its head and the callee doing the work, with that callee's
            # figures (e.g. `endless > __getitem__`: 80 calls of __getitem__).
            label, end = _chain(name, slot)
            rows.append({"name": label, "depth": d, "calls": end["calls"],
                         "total_ms": round(end["ms"], 4),
                         "share_pct": round(100.0 * end["ms"] / total, 1)})
            if d < depth:
                emit(end["children"], d + 1)

    emit(merged, 1)
    self_ms = max(0.0, total - child_total)
    return {
        "calls": len(roots),
        "total_ms": round(total, 4),
        "mean_ms": round(total / len(roots), 4) if roots else 0.0,
        "self_ms": round(self_ms, 4),
        "self_pct": round(100.0 * self_ms / total, 1) if total > 0 else 0.0,
        "top": rows,
    }


# -- between calls ----------------------------------------------------------------------------
# The method is "idle-bound" when it runs less than this share of the time between its calls:
# the loop spends the rest elsewhere (waiting for data, sleeping, I/O). A share, not a time,
# so that a loaded machine (everything slower alike) does not change the verdict.
BUSY_SHARE_IDLE = 0.5


def busy_share(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """How much of the loop the method takes: cost of calls / time between their ends.

    Watch events carry ``ts`` (wall clock at return) and ``cost_ms``; consecutive calls from one
    thread give the loop period. None with fewer than 3 calls.
    """
    rows = [(float(e["ts"]), c, e.get("thread")) for e in events
            if isinstance(e, dict) and _as_float(e.get("ts")) is not None
            for c in (cost_ms(e),) if c is not None]
    if len(rows) < 3:
        return None
    rows.sort()
    gaps = [(b[0] - a[0]) * 1000.0 for a, b in zip(rows, rows[1:])]
    costs = [r[1] for r in rows[1:]]
    period = statistics.median(gaps)
    if period <= 0:
        return None
    share = min(1.0, sum(costs) / sum(gaps)) if sum(gaps) > 0 else 1.0
    threads = [r[2] for r in rows if r[2]]
    return {"calls": len(rows), "period_ms": round(period, 3),
            "cost_ms": round(statistics.median(costs), 3), "busy_share": round(share, 3),
            "thread": max(set(threads), key=threads.count) if threads else None}
