"""oom: an out-of-memory event in a snapshot, or a trace whose peak is close to device memory.

Snapshots: each ``oom`` entry in ``device_traces`` (requested size, free device memory), with
the largest free block and the biggest live allocations by stack at snapshot time.
Traces: peak reserved memory above 90 % of the device's memory (torch-tb-profiler's threshold).
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

FIX = [
    "Free what the biggest sites above hold before the failing step (drop references, "
    "`del` large temporaries, do not keep outputs/losses with their graphs).",
    "Lower the batch size, or keep it and use gradient accumulation.",
    "Cut activation memory: mixed precision (`torch.autocast`), activation checkpointing "
    "(`torch.utils.checkpoint`).",
]


def _key(pid: object, oom: dict[str, Any]) -> tuple[object, ...]:
    return (pid, oom["device"], oom["time_us"], oom["requested"], oom["where"])


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    # A snapshot's history ring holds every OOM still in it: an `arm --on oom` that fired twice
    # wrote two snapshots, the second holding both OOMs. Each OOM is told once, by the first
    # snapshot (in time) where it is the latest on its device: that snapshot's live allocations
    # are the state closest after it; older OOMs of a history are evidence, not findings.
    told: set[tuple[object, ...]] = set()
    for snap in sorted(ctx.snapshots, key=lambda s: s.data["time"] or 0.0):
        d = snap.data
        latest: dict[int, dict[str, Any]] = {}
        earlier: dict[int, list[dict[str, Any]]] = {}
        for oom in d["ooms"]:
            prev = latest.get(oom["device"])
            if prev is not None:
                earlier.setdefault(oom["device"], []).append(prev)
            latest[oom["device"]] = oom
        for oom in latest.values():
            if _key(d["pid"], oom) in told:
                continue
            told.add(_key(d["pid"], oom))
            before = earlier.get(oom["device"], [])
            dev = d["devices"].get(str(oom["device"]), {})
            largest = dev.get("largest_free_block", 0)
            inactive = dev.get("inactive_bytes", 0)
            frag = inactive >= oom["requested"] > largest
            fix = list(FIX)
            if frag:
                fix.insert(0, "The cached free memory would fit the request but no single block "
                              "does: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
            out.append(Finding(
                rule="oom", severity="critical",
                title=f"CUDA out of memory on device {oom['device']}: {fmt_bytes(oom['requested'])} requested",
                summary=(f"{snap.name}: an allocation of {fmt_bytes(oom['requested'])} failed with "
                         f"{fmt_bytes(oom['device_free'])} free on the device; "
                         f"{fmt_bytes(dev.get('allocated'))} allocated, "
                         f"{fmt_bytes(dev.get('reserved'))} reserved, largest free cached block "
                         f"{fmt_bytes(largest)}."),
                evidence=[f"requested {oom['requested']} bytes, device_free {oom['device_free']} bytes",
                          f"allocated {dev.get('allocated')} bytes, reserved {dev.get('reserved')} bytes",
                          f"cached free (inactive) {inactive} bytes, largest free block {largest} bytes"]
                + [f"live: {s['site']}: {fmt_bytes(s['bytes'])} in {s['count']} blocks"
                   for s in d["sites"][:5] if s["device"] == oom["device"]]
                + ([f"{len(before)} earlier OOM(s) on this device in the history, the last: "
                    f"{fmt_bytes(before[-1]['requested'])} requested at {before[-1]['where']}"]
                   if before else []),
                where=[f"failed at {oom['where']}"]
                + [f"{s['site']} holds {fmt_bytes(s['bytes'])}" for s in d["sites"][:5]
                   if s["device"] == oom["device"]],
                fix=fix, inputs=[snap.path],
                root_cause=("Fragmentation: enough free memory is cached, but split into blocks "
                            "smaller than the request." if frag else
                            "The live allocations above fill the device; the request cannot fit."),
                metrics={"requested": oom["requested"], "device_free": oom["device_free"],
                         "largest_free_block": largest, "allocated": dev.get("allocated"),
                         "reserved": dev.get("reserved"), "fragmentation": frag,
                         "earlier_ooms": len(before)},
            ))
    for tr in ctx.traces:
        totals = {p.get("id"): p.get("total_memory") for p in tr.data.get("device_properties", [])}
        for dev, mem in (tr.data.get("memory") or {}).items():
            if not dev.startswith("cuda:"):
                continue
            total = totals.get(int(dev.split(":")[1]))
            if not total:
                continue
            peak = max(mem.get("peak_reserved", 0), mem.get("peak_allocated", 0))
            pct = 100.0 * peak / total
            if pct < T.peak_memory_pct:
                continue
            out.append(Finding(
                rule="oom", severity="warning",
                title=f"Peak memory on {dev} is {pct:.0f}% of the device",
                summary=(f"{label(tr)}: peak {fmt_bytes(peak)} of {fmt_bytes(total)} on {dev}; "
                         "the next larger batch or input will run out of memory."),
                evidence=[f"peak allocated {mem.get('peak_allocated')} bytes, peak reserved "
                          f"{mem.get('peak_reserved')} bytes, device total {total} bytes"],
                where=[f"{r['where']} via {r['operator']}" for r in mem.get("surviving_allocations", [])[:3]]
                or [dev],
                fix=FIX[1:], inputs=[tr.path],
                root_cause="The working set is close to the device's memory.",
                metrics={"peak_bytes": peak, "total_bytes": total, "pct": round(pct, 2)},
            ))
    return out


RULE = Rule("oom", "Out of memory, or about to be", check)
