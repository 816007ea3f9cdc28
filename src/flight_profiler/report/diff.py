"""``report --diff BEFORE AFTER``: what a change did, as a verdict with its evidence.

Both inputs must be of one kind: two traces (step time, operators, kernels, DataLoader wait,
GPU busy, memory), two memory snapshots (allocated / reserved / segments per device), or two
censuses (tensors, bytes, graph bytes, holders). Times are compared per step when both traces
have ProfilerSteps (runs of different lengths stay comparable), else over the whole window.
Plain data out (``Diff.to_dict()``); views live in render/diff_view.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flight_profiler.report.loaders import load_one
from flight_profiler.report.models import InputResult, strict
from flight_profiler.report.units import fmt_bytes

# Changes smaller than this (percent) are noise on a shared machine: not in the verdict.
NOISE_PCT = 5.0
TOP = 8


class DiffError(ValueError):
    """The two inputs cannot be compared (unreadable, or of different kinds)."""


@dataclass
class Change:
    what: str
    before: float | None
    after: float | None
    unit: str  # "us" | "bytes" | "pct" | "count"

    @property
    def delta_pct(self) -> float | None:
        if self.before in (None, 0) or self.after is None:
            return None
        return round(100.0 * (self.after - self.before) / self.before, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "before": self.before, "after": self.after, "unit": self.unit,
                "delta_pct": self.delta_pct}


@dataclass
class Diff:
    kind: str
    before: str
    after: str
    verdict: str
    headline: Change | None = None
    sections: dict[str, list[Change]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON-ready (a non-finite figure from a hostile input becomes None)."""
        out: dict[str, Any] = strict({
            "kind": self.kind, "before": self.before, "after": self.after, "verdict": self.verdict,
            "headline": self.headline.to_dict() if self.headline else None,
            "sections": {k: [c.to_dict() for c in v] for k, v in self.sections.items()},
            "notes": list(self.notes)})
        return out


def compare(before_path: str, after_path: str) -> Diff:
    before, after = load_one(before_path), load_one(after_path)
    for inp in (before, after):
        if not inp.ok:
            raise DiffError(f"{inp.path}: {inp.error}")
    if before.kind != after.kind:
        raise DiffError(f"cannot compare a {before.kind} with a {after.kind}")
    if before.kind == "trace":
        return _traces(before, after)
    if before.kind == "snapshot":
        return _snapshots(before, after)
    if before.kind == "census":
        return _censuses(before, after)
    raise DiffError(f"--diff compares traces, snapshots or censuses, not {before.kind} documents")


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "us":
        return f"{v / 1000:.2f} ms" if abs(v) >= 1000 else f"{v:.0f} us"
    if unit == "bytes":
        return fmt_bytes(v)
    if unit == "pct":
        return f"{v:.1f}%"
    return f"{v:g}"


def _phrase(c: Change) -> str:
    d = c.delta_pct
    if c.before and not c.after:
        return f"{c.what} gone"
    if not c.before and c.after:
        return f"{c.what} new ({fmt_value(c.after, c.unit)})"
    return f"{c.what} {d:+.0f}%" if d is not None else c.what


def _significant(changes: list[Change]) -> list[Change]:
    out = []
    for c in changes:
        d = c.delta_pct
        if (d is not None and abs(d) >= NOISE_PCT) or (bool(c.before) != bool(c.after)):
            out.append(c)
    return out


def _per(rows: list[dict[str, Any]] | None, value: str, scale: float) -> dict[str, float]:
    return {r["name"]: float(r[value]) / scale for r in rows or []}


def _named(before: dict[str, float], after: dict[str, float], unit: str) -> list[Change]:
    """Rows present in either top list; one missing from a list is below that list's cut-off
    (not necessarily gone), so it is compared only when the other side is clearly bigger."""
    changes = []
    for name in dict.fromkeys([*before, *after]):
        b, a = before.get(name), after.get(name)
        if b is None and a is not None and after and a < min(after.values()) * 2:
            continue
        if a is None and b is not None and before and b < min(before.values()) * 2:
            continue
        changes.append(Change(name, b or 0.0, a or 0.0, unit))
    changes.sort(key=lambda c: -abs((c.after or 0) - (c.before or 0)))
    return changes[:TOP]


def _traces(before: InputResult, after: InputResult) -> Diff:
    b, a = before.data, after.data
    nb, na = (b.get("steps") or {}).get("count", 0), (a.get("steps") or {}).get("count", 0)
    per_step = bool(nb and na)
    notes = []
    if per_step:
        headline = Change("step time", (b["steps"] or {}).get("median_us"), (a["steps"] or {}).get("median_us"), "us")
        sb, sa = float(nb), float(na)
        notes.append(f"per-step figures: {nb} steps before, {na} after (median step time; operator and kernel "
                     "times divided by the step count)")
    else:
        headline = Change("profiled window", b.get("window_us"), a.get("window_us"), "us")
        sb = sa = 1.0
        notes.append("no ProfilerStep in one of the traces: whole windows compared; profile the same number of "
                     "calls (or use `torch profile --schedule`) for a like-for-like comparison")
    ops = _named(_per(b.get("top_operators"), "self_us", sb), _per(a.get("top_operators"), "self_us", sa), "us")
    kernels = _named(_per(b.get("top_kernels"), "total_us", sb), _per(a.get("top_kernels"), "total_us", sa), "us")
    other: list[Change] = []
    dl_b, dl_a = (b.get("dataloader") or {}).get("total_us", 0.0), (a.get("dataloader") or {}).get("total_us", 0.0)
    if dl_b or dl_a:
        other.append(Change("DataLoader wait", dl_b / sb, dl_a / sa, "us"))
    gb, ga = b.get("gpu_time_breakdown"), a.get("gpu_time_breakdown")
    if gb and ga:
        other.append(Change("GPU busy", gb.get("busy_pct"), ga.get("busy_pct"), "pct"))
    sync_b, sync_a = (b.get("sync") or {}).get("sync_us"), (a.get("sync") or {}).get("sync_us")
    if sync_b or sync_a:
        other.append(Change("CUDA sync wait", (sync_b or 0.0) / sb, (sync_a or 0.0) / sa, "us"))
    mb, ma = b.get("memory"), a.get("memory")
    if mb and ma:
        other.append(Change("peak allocated", mb.get("peak_allocated"), ma.get("peak_allocated"), "bytes"))
    ag_b, ag_a = (b.get("autograd") or {}), (a.get("autograd") or {})
    if ag_b.get("forward_ops_recording") or ag_a.get("forward_ops_recording"):
        other.append(Change("ops recording autograd", (ag_b.get("forward_ops_recording") or 0) / sb,
                            (ag_a.get("forward_ops_recording") or 0) / sa, "count"))
    # A driver must also move the headline: >= 1 % of the step (or window) time.
    floor = 0.01 * float(headline.before or 0)
    timed = [c for c in _significant([*ops, *kernels, *other])
             if c.unit == "us" and abs((c.after or 0) - (c.before or 0)) >= floor]
    drivers = [c for c in timed if c.what != "DataLoader wait"][:2] + [
        c for c in timed if c.what == "DataLoader wait"] + [
        c for c in _significant(other) if c.what == "ops recording autograd" and not c.after]
    verdict = _verdict(headline, drivers)
    return Diff("trace", before.path, after.path, verdict, headline,
                {"operators (self time)": ops, "kernels": kernels, "other": other}, notes)


def _verdict(headline: Change, drivers: list[Change]) -> str:
    d = headline.delta_pct
    if d is None:
        head = f"{headline.what}: not comparable"
    elif abs(d) < NOISE_PCT:
        head = f"{headline.what} unchanged ({d:+.0f}%, within noise)"
    else:
        head = f"{headline.what} {d:+.0f}%"
    return head + (": " + ", ".join(_phrase(c) for c in drivers) if drivers else "")


def _snapshots(before: InputResult, after: InputResult) -> Diff:
    b, a = before.data, after.data
    totals = [Change("allocated", b.get("allocated"), a.get("allocated"), "bytes"),
              Change("reserved", b.get("reserved"), a.get("reserved"), "bytes")]
    devices: list[Change] = []
    for dev in dict.fromkeys([*(b.get("devices") or {}), *(a.get("devices") or {})]):
        db, da = (b.get("devices") or {}).get(dev, {}), (a.get("devices") or {}).get(dev, {})
        for key in ("allocated", "reserved", "segments"):
            devices.append(Change(f"{dev} {key}", db.get(key), da.get(key), "count" if key == "segments" else "bytes"))
    verdict = _verdict(totals[0], _significant(totals[1:]))
    return Diff("snapshot", before.path, after.path, verdict, totals[0], {"memory": totals, "devices": devices})


def _censuses(before: InputResult, after: InputResult) -> Diff:
    b, a = before.data["totals"], after.data["totals"]
    totals = [Change("tensor bytes", b["bytes"], a["bytes"], "bytes"),
              Change("tensors", b["count"], a["count"], "count"),
              Change("tensors with grad_fn", b["with_grad_fn"], a["with_grad_fn"], "count"),
              Change("graph bytes", b["graph_bytes"], a["graph_bytes"], "bytes")]
    hb = {h["path"]: h["bytes"] + h["graph_bytes"] for h in before.data["holders"]}
    ha = {h["path"]: h["bytes"] + h["graph_bytes"] for h in after.data["holders"]}
    holders = [Change(p, float(hb.get(p, 0)), float(ha.get(p, 0)), "bytes") for p in dict.fromkeys([*hb, *ha])]
    holders.sort(key=lambda c: -abs((c.after or 0) - (c.before or 0)))
    holders = [c for c in holders if c.before != c.after][:TOP]
    headline = Change("live tensor memory", b["bytes"] + b["graph_bytes"], a["bytes"] + a["graph_bytes"], "bytes")
    verdict = _verdict(headline, _significant(holders)[:3])
    return Diff("census", before.path, after.path, verdict, headline, {"totals": totals, "holders (bytes + graph)": holders})
