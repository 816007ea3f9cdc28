"""Per-step figures that need the step model: the DataLoader's waits clipped to whole steps, and
the graphs built in the steps that no backward used.

``dataloader_waits``: each ``enumerate(DataLoader)...__next__`` span counts only for the part of
it inside whole steps. A wait cut by the end of the window (the profiler stopped while the loop
waited: a span 1.5 s long ending exactly at the window's end) is no measurement of the loop: in
a window without steps, spans touching either edge are left out; either way the report says
how many were clipped or left out.

``unused_graph_nodes``: forward operators of a model (linear, conv, lstm ...) that recorded an autograd
node, matched by sequence number against the backward functions that ran. A forward whose node
no backward ran built a graph nobody used: inference with grad on. Judged in whole steps but the
last (a graph built late in a step may be used by the next step's backward: a GAN's generator
output; with one whole step, that one), and only where steps are known: a method's calls alone (a forward, its backward after
it returns) cannot say whether a backward comes later.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from flight_profiler.report.attribution import attribute
from flight_profiler.report.overlap import idle_during
from flight_profiler.report.stacks import CallerIndex, frame_location, is_user_frame
from flight_profiler.report.steps import StepModel
from flight_profiler.report.trace_loader import PY_FRAME, RawTrace

# A span that ends (or starts) this close to the window's edge was cut by it.
EDGE_US = 1000.0
MAX_PER_STEP = 1000


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


def _overlap(ts: float, end: float, steps: list[tuple[int, float, float]],
             starts: list[float]) -> list[tuple[int, float]]:
    """(step index, overlap us) of [ts, end) with each whole step it touches."""
    out = []
    j = max(0, bisect_right(starts, ts) - 1)
    while j < len(steps) and steps[j][1] < end:
        lo = max(ts, steps[j][1])
        hi = min(end, steps[j][1] + steps[j][2])
        if hi > lo:
            out.append((j, hi - lo))
        j += 1
    return out


def dataloader_waits(raw: RawTrace, index: CallerIndex, steps: list[tuple[int, float, float]],
                     busy: list[tuple[float, float]], edges: tuple[float, float] | None,
                     window: float) -> dict[str, Any]:
    """The DataLoader's next() time inside whole steps (all of the trace without steps)."""
    kept: list[tuple[int, float, float]] = []  # (thread, ts, us) of the part that counts
    clipped = dropped = 0
    cut_us = 0.0
    per_step = [0.0] * len(steps)
    starts = [s[1] for s in steps]
    for key, ts, dur in raw.dataloader:
        end = ts + dur
        if steps:
            parts = _overlap(ts, end, steps, starts)
            inside = sum(us for _, us in parts)
            for j, us in parts:
                per_step[j] += us
            if inside <= 0:
                dropped += 1
                cut_us += dur
                continue
            if inside < dur - 1e-6:
                clipped += 1
                cut_us += dur - inside
            first = steps[parts[0][0]][1]
            kept.append((key, max(ts, first), inside))
        elif edges is not None and (end >= edges[1] - EDGE_US or ts <= edges[0] + EDGE_US):
            dropped += 1
            cut_us += dur
        else:
            kept.append((key, ts, dur))
    total = sum(us for _, _, us in kept)
    out: dict[str, Any] = {
        "calls": len(kept), "total_us": round(total, 3),
        "gpu_idle_during_us": (round(idle_during(busy, [(t, t + d) for _, t, d in kept]), 3)
                               if busy else None),
        "pct_of_window": _pct(total, window),
        "mean_us": round(total / len(kept), 3) if kept else 0.0,
        "callers": attribute(index, [(k, t, d, "DataLoader.__next__") for k, t, d in kept]),
        "clipped": clipped, "left_out": dropped, "cut_us": round(cut_us, 3),
    }
    if steps:
        out["per_step_pct"] = [_pct(w, d) for w, (_, _, d) in zip(per_step, steps)][:MAX_PER_STEP]
    return out


def in_dataloader(raw: RawTrace) -> Callable[[int, float], bool]:
    """Whether (thread, t) is inside a DataLoader `next()` of that thread: a Dataset's
    `__getitem__` run in the loop's own process (num_workers=0) issues its per-sample indexing
    there, which is the loader's cost (dataloader-bottleneck), not a loop of the program's."""
    spans: dict[int, tuple[list[float], list[float]]] = {}
    for key, ts, dur in sorted(raw.dataloader):
        starts, ends = spans.setdefault(key, ([], []))
        starts.append(ts)
        ends.append(ts + dur)

    def inside(key: int, t: float) -> bool:
        own = spans.get(key)
        if own is None:
            return False
        i = bisect_right(own[0], t) - 1
        return i >= 0 and t <= own[1][i]
    return inside


def user_frames(index: CallerIndex, key: int, t: float) -> list[str]:
    """The program's own frames open at (thread, t), innermost first, as file:line (function)
    (torch's Python frames are named by their function's first line)."""
    nested = index._thread(key)  # the same index, one more question
    if nested is None:
        return []
    names = index.raw.names
    p = bisect_right(nested.ts, t) - 1
    while p >= 0 and nested.end[p] < t:
        p = nested.parent[p]
    out: list[str] = []
    while p >= 0:
        if nested.kind[p] == PY_FRAME:
            name = names[nested.name[p]]
            if is_user_frame(name):
                out.append(frame_location(name))
        p = nested.parent[p]
    return out


def _unused_runs(order: list[tuple[float, int]], unused: dict[int, Any]) -> tuple[int, int]:
    """(longest, count) of the runs of graph nodes built one after another, none of them used by
    a backward. The longest: a whole forward pass nobody differentiates (an evaluation once an
    epoch is one such run however many training steps dilute it), where a graph carried into the
    next step is a few nodes at a time. The count: an output computed and dropped at every
    call of a forward that is otherwise trained (the tutorial's character RNN computes its
    output at every character and uses the last) is many short runs between used nodes."""
    best = run = runs = 0
    counted: set[int] = set()
    for _ts, seq in sorted(order):
        if seq not in unused:
            run = 0
            counted.clear()
        elif seq not in counted:  # one node may be recorded by nested ops (linear > addmm)
            counted.add(seq)
            if run == 0:
                runs += 1
            run += 1
            best = max(best, run)
    return best, runs


def unused_graph_nodes(raw: RawTrace, index: CallerIndex, model: StepModel) -> dict[str, Any]:
    """Graphs built in whole steps (but the last) and used by no backward; {} if not judged."""
    if model.region or not model.steps:
        return {}
    # One whole step (a long LBFGS step in a short window) is judged itself: a graph carried
    # into the next step is then at most a few nodes (a GAN's generator output), far from
    # eval-with-grad's bar.
    judged = model.steps[:-1] if len(model.steps) > 1 else model.steps
    lo, hi = judged[0][1], judged[-1][1] + judged[-1][2]
    used = raw.bwd_seqs
    seen: set[int] = set()
    unused: dict[int, tuple[int, float, int]] = {}  # seq -> (thread, ts, name id)
    order: list[tuple[float, int]] = []  # (ts, seq) of every model node, for the bursts below
    for seq, ts, key, nid in zip(raw.fwd_seq, raw.fwd_ts, raw.fwd_key, raw.fwd_name):
        if not lo <= ts < hi or seq < 0:
            continue
        seen.add(seq)
        order.append((ts, seq))
        if seq not in used and seq not in unused:
            unused[seq] = (key, ts, nid)
    if not seen:
        return {"judged_steps": len(judged), "model_nodes": 0, "unused_nodes": 0}
    sample = sorted(unused.values(), key=lambda u: u[1])[:: max(1, len(unused) // 200)][:200]
    places: dict[str, int] = {}
    for key, ts, _nid in sample:
        frames = user_frames(index, key, ts)
        place = " called from ".join(frames[:2]) if frames else "(no Python stack)"
        places[place] = places.get(place, 0) + 1
    longest, runs = _unused_runs(order, unused)
    names: dict[str, int] = {}
    for _key, _ts, nid in unused.values():
        name = raw.names[nid]
        names[name] = names.get(name, 0) + 1
    return {
        "judged_steps": len(judged), "model_nodes": len(seen), "unused_nodes": len(unused),
        "unused_per_step": round(len(unused) / len(judged), 1),
        "longest_unused_run": longest, "unused_runs": runs,
        "unused_ops": [{"name": k, "calls": v} for k, v in sorted(names.items(), key=lambda kv: -kv[1])[:5]],
        "unused_where": [{"where": k, "share": round(v / len(sample), 3)}
                         for k, v in sorted(places.items(), key=lambda kv: -kv[1])[:3]],
    }
