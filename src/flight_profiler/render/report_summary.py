"""Figures the report views share: memory state rows, performance rows, ordered fixes."""

from __future__ import annotations

import re
from typing import TypedDict

from flight_profiler.report.models import InputResult, Report
from flight_profiler.report.units import fmt_bytes, fmt_pct, fmt_us

_VOID = re.compile(r"(^|\s)void\s+")
_NS = re.compile(r"\b(?:at::native::|at::|c10::|cutlass::|cub::)")
_ANON = re.compile(r"\(anonymous namespace\)::")


def trace_label(inp: InputResult) -> str:
    return inp.name + (f" (rank {inp.rank})" if inp.kind == "trace" and inp.rank is not None else "")


def _drop_nested(text: str, open_c: str, close_c: str, keep: str) -> str:
    """Replace every outermost ``open_c ... close_c`` by ``keep`` (template or argument lists)."""
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == open_c:
            if depth == 0:
                out.append(keep)
            depth += 1
        elif ch == close_c and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def short_name(name: str, width: int) -> str:
    """A kernel or operator name that fits ``width``: no ``void``, no argument list, template
    arguments folded to ``<...>`` and common namespaces dropped when it is too long."""
    if len(name) <= width:
        return name
    s = _ANON.sub("", _VOID.sub(r"\1", name))
    if len(s) > width:
        s = _drop_nested(s, "(", ")", "")
    if len(s) > width:
        s = _drop_nested(s, "<", ">", "<...>")
    if len(s) > width:
        s = _NS.sub("", s)
    if len(s) > width:
        s = s[: max(1, width - 3)] + "..."
    return s


def fit_line(line: str, width: int) -> str:
    """``name: figures`` made to fit by shortening the name, the figures kept whole."""
    if len(line) <= width:
        return line
    head, sep, tail = line.rpartition(": ")
    if sep and len(tail) + 12 < width:
        return short_name(head, width - len(tail) - 2) + ": " + tail
    return short_name(line, width)


def memory_rows(report: Report) -> list[dict[str, str]]:
    """One row per (input, device): total, allocated, reserved, peak."""
    rows = []
    for inp in report.readable:
        if inp.kind == "snapshot":
            for dev, d in inp.data["devices"].items():
                rows.append({"source": inp.name, "device": f"{inp.data['device_type']}:{dev}",
                             "total": "?", "allocated": fmt_bytes(d["allocated"]),
                             "reserved": fmt_bytes(d["reserved"]),
                             "peak": fmt_bytes(d["peak_allocated_in_trace"])})
        elif inp.kind == "census":
            t = inp.data["totals"]
            rows.append({"source": inp.name, "device": "all (census)", "total": "?",
                         "allocated": f"{fmt_bytes(t['bytes'])} in {t['count']} tensors",
                         "reserved": "-", "peak": "-"})
        elif inp.kind == "trace":
            totals = {p.get("id"): p.get("total_memory") for p in inp.data.get("device_properties", [])}
            for dev, m in (inp.data.get("memory") or {}).items():
                total = totals.get(int(dev.split(":")[1])) if dev.startswith("cuda:") else None
                rows.append({"source": inp.name, "device": dev,
                             "total": fmt_bytes(total) if total else "?",
                             "allocated": fmt_bytes(m["final_allocated"]),
                             "reserved": (fmt_bytes(m["peak_reserved"]) + " (peak)")
                             if m["peak_reserved"] else "-",
                             "peak": fmt_bytes(m["peak_allocated"])})
    return rows


def perf_rows(report: Report) -> list[dict[str, str]]:
    rows = []
    for inp in report.readable:
        if inp.kind != "trace":
            continue
        m = inp.data
        s = m.get("steps", {})
        b = m.get("gpu_time_breakdown")
        rows.append({
            "trace": inp.name + (f" (rank {inp.rank})" if inp.rank is not None else ""),
            "events": str(m.get("events")),
            "steps": str(s.get("count", 0)),
            "step time": (f"{fmt_us(s['mean_us'])} mean, {fmt_us(s['median_us'])} median, "
                          f"cv {s['cv']:.2f}") if s.get("count") else f"window {fmt_us(m.get('window_us'))}",
            "GPU idle/compute/other": (f"{fmt_pct(b['idle_pct'])} / {fmt_pct(b['compute_pct'])} / "
                                        f"{fmt_pct(b['non_compute_pct'])}") if b else "no GPU events",
            "DataLoader": fmt_pct(m["dataloader"]["pct_of_window"]) if m.get("dataloader") else "-",
            "sync": fmt_pct(m["sync"]["pct_of_window"]) if m.get("sync") else "-",
            "H<->D copies": (fmt_pct(m["memcpy"]["host_device_pct_of_gpu_busy"]) + " of GPU busy")
            if m.get("memcpy") else "-",
        })
    return rows


class HotRow(TypedDict):
    """One row of the key operations table: an operator (self time) or a kernel (total)."""

    trace: str
    kind: str
    name: str
    calls: int
    time: str
    us: float


def hot_rows(report: Report, limit: int = 10) -> list[HotRow]:
    rows: list[HotRow] = []
    for inp in report.readable:
        if inp.kind != "trace":
            continue
        for o in inp.data.get("top_operators", [])[:limit]:
            rows.append({"trace": inp.name, "kind": "operator", "name": o["name"],
                         "calls": o["calls"], "time": fmt_us(o["self_us"]) + " self",
                         "us": o["self_us"]})
        for k in inp.data.get("top_kernels", [])[:limit]:
            rows.append({"trace": inp.name, "kind": "kernel", "name": k["name"],
                         "calls": k["calls"], "time": fmt_us(k["total_us"]), "us": k["total_us"]})
    return rows


def ordered_fixes(report: Report) -> list[tuple[str, str]]:
    """(rule, fix) most severe first, de-duplicated; code changes come before settings."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for f in report.findings:
        if f.severity == "info":
            continue
        for fix in f.fix:
            if fix not in seen:
                seen.add(fix)
                out.append((f.rule, fix))
    return out


def memory_heading(report: Report) -> str:
    """"GPU Memory State" only when some input shows a GPU; CPU-only runs say so."""
    for inp in report.readable:
        if inp.kind == "snapshot" and str(inp.data.get("device_type", "")).startswith("cuda"):
            return "GPU Memory State"
        if inp.kind == "trace" and (inp.data.get("has_gpu")
                                    or any(str(d).startswith("cuda") for d in inp.data.get("memory") or {})):
            return "GPU Memory State"
    return "Memory State (CPU)"


def memory_columns(rows: list[dict[str, str]]) -> list[str]:
    """The memory table's columns, without those no input could fill (a CPU has no "total")."""
    cols = ["source", "device", "total", "allocated", "reserved", "peak"]
    return [c for c in cols if c in ("source", "device")
            or any(r.get(c) not in ("?", "-", "", None) for r in rows)]


def quiet_text(report: Report) -> str:
    """What to say when no problem was found: an all-clear only if nothing was out of reach."""
    gaps = [f for f in report.findings if f.rule == "coverage"]
    if gaps:
        return ("No known problem pattern found in these inputs, but they cannot show everything: "
                + " ".join(f.summary for f in gaps))
    return "No known problem pattern found in these inputs."
