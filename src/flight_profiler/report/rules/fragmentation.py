"""fragmentation: the caching allocator reserves far more than is allocated.

Snapshots (CUDA): reserved / allocated above 1.5x with at least 512 MiB wasted, and the
count of inactive blocks inside split segments. Traces: peak reserved vs peak allocated from
``[memory]`` events on CUDA devices.
"""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes


def _fix(expandable: bool | None) -> list[str]:
    fix = []
    if expandable is False:
        fix.append("expandable_segments is off: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                   "so that segments grow in place instead of splitting.")
    elif expandable is None:
        fix.append("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the snapshot does not say "
                   "whether it is on).")
    fix += [
        "Keep tensor shapes stable between steps (pad variable-length batches to a few bucket sizes).",
        "If large allocations alternate with small ones, try max_split_size_mb in PYTORCH_CUDA_ALLOC_CONF.",
        "torch.cuda.empty_cache() only returns cached memory to other processes; it does not defragment.",
    ]
    return fix


def _severity(ratio: float) -> str:
    return "critical" if ratio >= T.frag_critical_ratio else "warning"


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for snap in ctx.snapshots:
        d = snap.data
        if d["device_type"] != "cuda":
            continue
        for dev, s in d["devices"].items():
            alloc, res = s["allocated"], s["reserved"]
            waste = res - alloc
            ratio = res / alloc if alloc else float("inf") if res else 0.0
            if not (ratio > T.frag_ratio and waste >= T.frag_min_waste_bytes):
                continue
            many_split = s["inactive_split_blocks"] >= T.frag_inactive_split_blocks
            out.append(Finding(
                rule="fragmentation", severity=_severity(ratio),
                title=f"Reserved memory is {ratio:.1f}x the allocated memory on cuda:{dev}",
                summary=(f"{snap.name}: {fmt_bytes(res)} reserved for {fmt_bytes(alloc)} allocated "
                         f"({fmt_bytes(waste)} cached but unused); {s['inactive_split_blocks']} inactive "
                         f"blocks in split segments, largest free block {fmt_bytes(s['largest_free_block'])}."),
                evidence=[f"reserved {res} bytes in {s['segments']} segments, allocated {alloc} bytes",
                          f"inactive {s['inactive_bytes']} bytes; {s['inactive_split_blocks']} inactive "
                          "split blocks" + (" (many)" if many_split else ""),
                          f"allocator settings: expandable_segments={d['expandable_segments']}"],
                where=[f"cuda:{dev}"] + [f"{x['site']} holds {fmt_bytes(x['bytes'])}"
                                        for x in d["sites"][:3] if str(x["device"]) == dev],
                fix=_fix(d["expandable_segments"]), inputs=[snap.path],
                root_cause=("Freed blocks are cached in sizes that later requests cannot reuse, so "
                            "the allocator keeps reserving new segments."),
                metrics={"reserved": res, "allocated": alloc, "ratio": round(ratio, 3),
                         "inactive_split_blocks": s["inactive_split_blocks"],
                         "largest_free_block": s["largest_free_block"],
                         "expandable_segments": d["expandable_segments"]},
            ))
    for tr in ctx.traces:
        for dev, mem in (tr.data.get("memory") or {}).items():
            if not dev.startswith("cuda"):
                continue
            alloc, res = mem.get("peak_allocated", 0), mem.get("peak_reserved", 0)
            if alloc <= 0:
                continue
            ratio = res / alloc
            if ratio > T.frag_ratio and res - alloc >= T.frag_min_waste_bytes:
                out.append(Finding(
                    rule="fragmentation", severity=_severity(ratio),
                    title=f"Peak reserved memory is {ratio:.1f}x the peak allocated on {dev}",
                    summary=(f"{label(tr)}: peak reserved {fmt_bytes(res)} vs peak allocated "
                             f"{fmt_bytes(alloc)} ({fmt_bytes(res - alloc)} cached but unused)."),
                    evidence=[f"peak_reserved {res} bytes, peak_allocated {alloc} bytes"],
                    where=[dev], fix=_fix(None), inputs=[tr.path],
                    root_cause="The caching allocator holds memory it cannot reuse for new requests.",
                    metrics={"reserved": res, "allocated": alloc, "ratio": round(ratio, 3)},
                ))
    return out


RULE = Rule("fragmentation", "Reserved memory far above allocated memory", check)
