"""Measured figures of one trace (one rank): everything the rules and the report read.

``trace_metrics(raw)`` returns plain JSON-ready data. Times are microseconds (``_us``),
shares are percentages (``_pct``), sizes bytes.
"""

from __future__ import annotations

import statistics
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

from flight_profiler.report.attribution import (
    MAX_ATTRIBUTED,
    NO_STACK,
    attribute,
    attribute_gpu,
    idle_after,
    idle_gaps,
)
from flight_profiler.report.overlap import (
    covered,
    exposed,
    idle_after_waits,
    length,
    short_gaps,
)
from flight_profiler.report.stacks import (
    CallerIndex,
    innermost_frame,
    is_user_frame,
    operator_self_times,
)
from flight_profiler.report.step_figures import (
    EDGE_US,
    dataloader_waits,
    in_dataloader,
    unused_graph_nodes,
)
from flight_profiler.report.steps import StepModel, find_steps
from flight_profiler.report.thresholds import T
from flight_profiler.report.trace_loader import (
    COMM,
    COMPUTE,
    MAX_THREADS,
    MEMORY,
    SCALAR_OPS,
    RawTrace,
)

SERIES_POINTS = 240


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


def _gpu_selection(raw: RawTrace, span: tuple[float, float] | None = None) -> tuple[Sequence[int], bool]:
    """Indices of the GPU events HTA would analyse, and whether its step filter applied.

    HTA (Trace._filter_irrelevant_gpu_kernels) keeps, when there are >= 2 ProfilerSteps, only
    GPU events launched (correlation) by a CPU call that started before the last ProfilerStep:
    the last step is usually cut short by the profiler stopping. With steps found from the
    loop's own marks (``span``: the whole steps), the events launched inside them. Indices are a
    compact array: a list of a million Python ints would cost 36 MB.
    """
    n = len(raw.g_ts)
    if span is not None:
        lo, hi = span
        allowed = {c for c, t in zip(raw.rt_corr, raw.rt_ts) if lo <= t < hi}
        corr = raw.g_corr
        return array("q", (i for i in range(n) if corr[i] in allowed)), True
    step_names = {num for num, _, _ in raw.steps}
    if len(step_names) < 2:
        return range(n), False
    last_start = max(ts for _, ts, _ in raw.steps)
    allowed = {c for c, t in zip(raw.rt_corr, raw.rt_ts) if t < last_start}
    corr = raw.g_corr
    return array("q", (i for i in range(n) if corr[i] in allowed)), True


def merge_idx(ts: Sequence[float], end: Sequence[float], idx: Iterable[int]) -> list[tuple[float, float]]:
    """``merge`` of the intervals ``idx`` picks, without building a tuple per interval."""
    order = sorted(idx, key=ts.__getitem__)
    out: list[tuple[float, float]] = []
    if not order:
        return out
    cs, ce = ts[order[0]], end[order[0]]
    for i in order:
        s, e = ts[i], end[i]
        if s <= ce:
            if e > ce:
                ce = e
        else:
            out.append((cs, ce))
            cs, ce = s, e
    out.append((cs, ce))
    return out


Spans = list[tuple[float, float]]


def gpu_breakdown(raw: RawTrace, within: tuple[float, float] | None = None,
                  ) -> tuple[dict[str, Any] | None, Spans, Spans, Sequence[int]]:
    """HTA's temporal breakdown; also the merged busy and compute intervals, and the selection."""
    idx, filtered = _gpu_selection(raw, within)
    if not idx:
        return None, [], [], range(0)
    ts, end, kind = raw.g_ts, raw.g_end, raw.g_kind
    busy = merge_idx(ts, end, idx)
    compute = merge_idx(ts, end, (i for i in idx if kind[i] == COMPUTE))
    span = busy[-1][1] - busy[0][0]
    busy_us = sum(e - s for s, e in busy)
    compute_us = sum(e - s for s, e in compute)
    idle_us = span - busy_us
    non_compute_us = span - compute_us - idle_us
    return {
        "span_us": round(span, 3),
        "busy_us": round(busy_us, 3),
        "idle_us": round(idle_us, 3),
        "compute_us": round(compute_us, 3),
        "non_compute_us": round(non_compute_us, 3),
        "idle_pct": _pct(idle_us, span),
        "compute_pct": _pct(compute_us, span),
        "non_compute_pct": _pct(non_compute_us, span),
        "busy_pct": _pct(busy_us, span),
        "events": len(idx),
        "last_step_excluded": filtered,
    }, busy, compute, idx


def _communication(raw: RawTrace, idx: Sequence[int], compute: Spans, span_us: float,
                   ) -> dict[str, Any] | None:
    """Collective kernels (NCCL, gloo) and how much of their time compute does not hide."""
    ts, end, kind, names = raw.g_ts, raw.g_end, raw.g_kind, raw.names
    comm_idx = [i for i in idx if kind[i] == COMM]
    if not comm_idx:
        return None
    comm = merge_idx(ts, end, comm_idx)
    comm_sum = sum(end[i] - ts[i] for i in comm_idx)
    kernel_sum = comm_sum + sum(end[i] - ts[i] for i in idx if kind[i] == COMPUTE)
    comm_us = length(comm)
    hidden = covered(comm, compute)
    by_name: dict[str, list[float]] = {}
    for i in comm_idx:
        a = by_name.setdefault(names[raw.g_name[i]], [0, 0.0])
        a[0] += 1
        a[1] += end[i] - ts[i]
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:5]
    return {
        "kernels": len(comm_idx), "comm_us": round(comm_us, 3),
        "pct_of_kernel_time": _pct(comm_sum, kernel_sum),
        "exposed_us": round(comm_us - hidden, 3), "exposed_pct_of_span": _pct(comm_us - hidden, span_us),
        "overlapped_pct": _pct(hidden, comm_us),
        "by_name": [{"name": k, "calls": int(v[0]), "total_us": round(v[1], 3),
                     "mean_us": round(v[1] / v[0], 3)} for k, v in top],
    }


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    vs = sorted(values)
    mean = statistics.fmean(vs)
    std = statistics.pstdev(vs) if len(vs) > 1 else 0.0
    return {
        "count": len(vs), "mean_us": round(mean, 3), "median_us": round(statistics.median(vs), 3),
        "min_us": round(vs[0], 3), "max_us": round(vs[-1], 3),
        "p90_us": round(vs[min(len(vs) - 1, int(0.9 * len(vs)))], 3),
        "std_us": round(std, 3), "cv": round(std / mean, 4) if mean else 0.0,
    }


def _downsample(xs: Sequence[float], ys: Sequence[float], n: int = SERIES_POINTS) -> list[list[float]]:
    if len(xs) <= n:
        return [[round(x, 3), y] for x, y in zip(xs, ys)]
    step = len(xs) / n
    out = []
    for k in range(n):
        lo, hi = int(k * step), max(int((k + 1) * step), int(k * step) + 1)
        j = max(range(lo, hi), key=ys.__getitem__)  # keep peaks visible
        out.append([round(xs[j], 3), ys[j]])
    return out


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and r^2."""
    n = len(xs)
    if n < 2:
        return 0.0, 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0:
        return 0.0, 0.0
    b = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return b, r2


def _memory(raw: RawTrace, index: CallerIndex, steps: list[tuple[int, float, float]],
            model: StepModel) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (dtype, did), (ts, alloc, reserved) in sorted(raw.mem.items()):
        label = ("cpu" if dtype == 0 else "cuda" if dtype == 1 else f"type{dtype}") + (
            f":{did}" if dtype != 0 else "")
        xs, ya, yr = ts.tolist(), alloc.tolist(), reserved.tolist()
        order = sorted(range(len(xs)), key=xs.__getitem__)
        xs = [xs[i] for i in order]
        ya = [ya[i] for i in order]
        yr = [yr[i] for i in order]
        info: dict[str, Any] = {
            "samples": len(xs), "peak_allocated": max(ya), "peak_reserved": max(yr),
            "final_allocated": ya[-1], "first_allocated": ya[0],
            "series": _downsample([x - xs[0] for x in xs], ya),
        }
        # Allocated at the end of each step: a leak grows it step after step. Calls of a method
        # that runs inside the step are no steps: what they allocate is freed after them.
        per_step: list[tuple[int, int]] = []
        unseen_frees = model.sessions and dtype == 0
        if unseen_frees:
            info["per_step_not_judged"] = ("each step is its own profiler session: the CPU "
                                           "total misses what is freed between them")
        for num, st, dur in [] if model.region or unseen_frees else steps:
            j = bisect_right(xs, st + dur) - 1
            if j >= 0 and xs[j] >= st:
                per_step.append((num, ya[j]))
        if len(per_step) >= 2:
            b, r2 = _slope([float(k) for k in range(len(per_step))], [float(v) for _, v in per_step])
            info["per_step_allocated"] = per_step
            info["slope_bytes_per_step"] = round(b, 1)
            info["slope_r2"] = round(r2, 4)
        # Allocations never freed inside the trace, made before the last step began.
        live = raw.mem_live.get((dtype, did), {})
        cutoff = steps[-1][1] if len(steps) >= 2 else float("inf")
        survivors: dict[tuple[str, str], list[float]] = {}
        olds = sorted(((t, b, k) for t, b, k in live.values() if t < cutoff), key=lambda x: -x[1])
        chosen = olds[:MAX_ATTRIBUTED]
        points = [(k, t) for t, _, k in chosen]
        for (_t, nbytes, _k), (line, ops) in zip(chosen, index.resolve(points)):
            g = survivors.setdefault((line or NO_STACK, ops[-1] if ops else "?"), [0, 0])
            g[0] += 1
            g[1] += nbytes
        rows: list[dict[str, Any]] = [
            {"where": k[0], "operator": k[1], "count": int(v[0]), "bytes": int(v[1])}
                for k, v in survivors.items()]
        rows.sort(key=lambda r: -r["bytes"])
        info["surviving_allocations"] = rows[:10]
        info["surviving_bytes"] = sum(b for _, b, _ in olds)
        out[label] = info
    return out


def trace_metrics(raw: RawTrace) -> dict[str, Any]:
    m: dict[str, Any] = {"events": raw.events}
    notes = loader_notes(raw)
    if notes:
        m["notes"] = notes
    if raw.gpu_untimed:
        m["gpu_events_untimed"] = raw.gpu_untimed
    index = CallerIndex(raw)
    model = find_steps(raw)
    m["step"] = model.to_dict()
    steps = model.steps
    # Steps found from the loop's marks follow each other: every per-step figure is taken
    # between the first and the last boundary, what the window's edges cut is left out.
    span = model.span if model.contiguous else None
    m["steps"] = _spread([d for _, _, d in steps])
    if steps:
        m["steps"]["numbers"] = [n for n, _, _ in steps][:1000]
        m["steps"]["durations_us"] = [round(d, 3) for _, _, d in steps][:1000]
    step_total = sum(d for _, _, d in steps)
    cpu_window = (raw.span_end - raw.span_ts) if raw.span_end > raw.span_ts else 0.0
    window = step_total if step_total > 0 else cpu_window
    m["window_us"] = round(window, 3)
    m["window_kind"] = "steps" if step_total > 0 else "trace"

    breakdown, busy, compute, selected = gpu_breakdown(raw, span)
    m["has_gpu"] = breakdown is not None
    if breakdown is not None:
        m["gpu_time_breakdown"] = breakdown
        m["gpu_devices"] = sorted(raw.gpu_devices)
        m["gpu_timeline"] = _busy_bins(busy)
        m["gpu_idle_gaps"] = idle_gaps(raw, index, busy)
        gap_us, gap_count = short_gaps(busy, T.launch_gap_us)
        breakdown["short_gap_us"] = round(gap_us, 3)
        breakdown["short_gaps"] = gap_count
        comm = _communication(raw, selected, compute, breakdown["span_us"])
        if comm is not None:
            m["communication"] = comm

    # Kernels and launches
    kdur: dict[str, list[float]] = {}
    durations: list[float] = []
    short_work: list[tuple[int, float, str]] = []
    names = raw.names
    for i in range(len(raw.g_ts)):
        if raw.g_kind[i] == COMPUTE or raw.g_kind[i] == 2:
            d = raw.g_end[i] - raw.g_ts[i]
            durations.append(d)
            if d < T.short_kernel_us:
                short_work.append((raw.g_corr[i], d, names[raw.g_name[i]]))
            a = kdur.get(names[raw.g_name[i]])
            if a is None:
                kdur[names[raw.g_name[i]]] = [1, d]
            else:
                a[0] += 1
                a[1] += d
    launches = raw.runtime.get("cudaLaunchKernel", [0, 0.0])
    if durations:
        short = sum(1 for d in durations if d < T.short_kernel_us)
        m["kernels"] = {
            "count": len(durations), "total_us": round(sum(durations), 3),
            "median_us": round(statistics.median(durations), 3),
            "short_count": short, "short_pct": _pct(short, len(durations)),
            "per_step": round(len(durations) / len(steps), 1) if steps else None,
            "launch_calls": int(launches[0]), "launch_total_us": round(launches[1], 3),
            "launch_mean_us": round(launches[1] / launches[0], 3) if launches[0] else 0.0,
            "short_callers": attribute_gpu(raw, index, short_work, longest=False),
        }
        top = sorted(kdur.items(), key=lambda kv: -kv[1][1])[: T.hot_rows]
        m["top_kernels"] = [{"name": k, "calls": int(v[0]), "total_us": round(v[1], 3),
                             "mean_us": round(v[1] / v[0], 3)} for k, v in top]

    # Operators (CPU) by self time
    outer = [0.0, 0.0, 0.0]
    outer_at: list[tuple[int, float]] = []
    ops, tiny_samples = operator_self_times(raw, T.tiny_op_us, MAX_ATTRIBUTED, span, outer, outer_at)
    # Issued from the program's own lines, not from a library's Python (an optimizer's
    # per-parameter loop) nor from its Dataset inside a DataLoader's next(): the share of a
    # sample of them whose innermost Python frame is the program's (all of them when the trace
    # has no Python frames).
    loading = in_dataloader(raw)
    frames = [(innermost_frame(index, k, t + 1e-3), loading(k, t + 1e-3))
              for k, t in outer_at[:MAX_ATTRIBUTED]]
    seen = [(f, dl) for f, dl in frames if f is not None]
    program = sum(1 for f, dl in seen if is_user_frame(f) and not dl) / len(seen) if seen else 1.0
    outer = [outer[0] * program, outer[1] * program, outer[2] * program]
    if ops:
        self_list = sorted(ops.items(), key=lambda kv: -kv[1][2])
        m["top_operators"] = [{"name": k, "calls": int(v[0]), "total_us": round(v[1], 3),
                               "self_us": round(v[2], 3), "mean_self_us": round(v[2] / v[0], 3)}
                              for k, v in self_list[: T.hot_rows]]
        calls = sum(int(v[0]) for v in ops.values())
        self_total = sum(v[2] for v in ops.values())
        tiny_calls = sum(int(v[0]) for v in ops.values() if v[2] / v[0] < T.tiny_op_us)
        tiny_self = sum(v[2] for v in ops.values() if v[2] / v[0] < T.tiny_op_us)
        m["operators"] = {
            "calls": calls, "distinct": len(ops), "self_total_us": round(self_total, 3),
            "tiny_calls": tiny_calls, "tiny_calls_pct": _pct(tiny_calls, calls),
            "tiny_self_us": round(tiny_self, 3), "tiny_self_pct_of_window": _pct(tiny_self, window),
            "tiny_self_pct_of_ops": _pct(tiny_self, self_total),
            "per_step": round(calls / len(steps), 1) if steps else None,
            # Issued one by one from the program's own Python, each doing almost nothing (a
            # loop over slices): what rewriting that loop removes (rule launch-overhead).
            "from_python_tiny_calls": int(outer[0]),
            "from_python_tiny_us": round(outer[1], 3),
            "from_python_tiny_pct_of_window": _pct(outer[1], window),
            # the same under twice the line: a count that the machine's speed does not move
            "from_python_small_calls": int(outer[2]),
            "tiny_callers": attribute(index, tiny_samples, longest=False),
        }

    # Host <-> device copies
    if raw.memcpy:
        kinds: dict[str, list[float]] = {}
        for name, dur, nbytes, _ in raw.memcpy:
            k = kinds.setdefault(name, [0, 0.0, 0])
            k[0] += 1
            k[1] += dur
            k[2] += nbytes
        busy_us = breakdown["busy_us"] if breakdown else 0.0
        m["memcpy"] = {
            "by_kind": [{"kind": k, "count": int(v[0]), "total_us": round(v[1], 3),
                         "bytes": int(v[2]), "pct_of_gpu_busy": _pct(v[1], busy_us)}
                        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][1])],
            "host_device_us": round(sum(v[1] for k, v in kinds.items() if _host_device(k)), 3),
        }
        m["memcpy"]["host_device_pct_of_gpu_busy"] = _pct(m["memcpy"]["host_device_us"], busy_us)
        m["memcpy"]["pageable_bytes"] = int(sum(v[2] for k, v in kinds.items() if "Pageable" in k))
        hd = merge_idx(raw.g_ts, raw.g_end, (i for i in selected if raw.g_kind[i] == MEMORY
                                            and _host_device(raw.names[raw.g_name[i]])))
        m["memcpy"]["host_device_exposed_us"] = round(exposed(hd, compute), 3)
        m["memcpy"]["callers"] = attribute_gpu(
            raw, index, [(c, d, n) for n, d, _b, c in raw.memcpy if _host_device(n)])

    # Synchronisation: waits inside whole steps; without steps, none cut by the window's edges
    edges = _trace_edges(raw) if model.kind == "window" else None
    syncs, cut_syncs = _inside(raw.syncs, span, edges)
    scalar_ops, cut_scalars = _inside(raw.scalar_ops, span, edges)
    sync_us = sum(d for _, _, d, _ in syncs)
    scalar_top = [s for s in scalar_ops if s[3] == "aten::item"] or [
        s for s in scalar_ops if s[3] == "aten::_local_scalar_dense"]
    scalar_us = sum(d for _, _, d, _ in scalar_top)
    blocking = syncs + scalar_top
    after = idle_after(busy, [ts + d for _, ts, d, _ in syncs]) if busy else []
    waits = [(ts + d, d) for _, ts, d, _ in syncs + scalar_top]
    lost = idle_after_waits(busy, waits) if busy else 0.0
    m["sync"] = {
        "sync_calls": len(syncs), "sync_us": round(sync_us, 3),
        "left_out": cut_syncs + cut_scalars,
        "by_call": {k: {"count": int(v[0]), "total_us": round(v[1], 3)}
                    for k, v in raw.runtime.items() if "ynchronize" in k},
        "scalar_reads": len(scalar_top), "scalar_read_us": round(scalar_us, 3),
        "pct_of_window": _pct(max(sync_us, scalar_us), window),
        "gpu_idle_after_sync_us": round(sum(after), 3),
        # The GPU idle the waits cause: idle after each return, capped by the wait, once per gap.
        "gpu_idle_caused_us": round(lost, 3),
        "callers": attribute(index, blocking, SCALAR_OPS) if blocking else [],
    }

    # DataLoader: its next() calls, the part of each inside whole steps
    if raw.dataloader:
        m["dataloader"] = dataloader_waits(raw, index, steps, busy, _trace_edges(raw), window)

    if raw.mem:
        m["memory"] = _memory(raw, index, steps, model)
    m["runtime_calls"] = {k: {"count": int(v[0]), "total_us": round(v[1], 3)}
                          for k, v in sorted(raw.runtime.items(), key=lambda kv: -kv[1][1])[:15]}
    m["autograd"] = {"forward_ops_recording": raw.autograd_fwd_ops, "backward_functions": raw.backward_ops,
                     "top_recording_ops": [{"name": k, "calls": v} for k, v in sorted(
                         raw.autograd_fwd_names.items(), key=lambda kv: -kv[1])[:8]],
                     **unused_graph_nodes(raw, index, model)}
    return m


def loader_notes(raw: RawTrace) -> list[str]:
    """What the loader left out of the figures, one line each (the views list them under the
    input): a figure taken without it must say so."""
    notes = []
    if raw.gpu_untimed:
        notes.append(f"{raw.gpu_untimed:,} of {raw.gpu_events:,} GPU events had no timestamps "
                     "(ts 0, dur 0) and were left out")
    if raw.threads_left_out:
        notes.append(f"{raw.threads_left_out:,} CPU events of threads past the first "
                     f"{MAX_THREADS:,} were left out")
    if raw.mended:
        notes.append(f"{raw.mended:,} line(s) of the file were not valid JSON (a name torch's "
                     "exporter wrote unescaped) and were read as escaped")
    return notes


def _inside(items: list[tuple[int, float, float, str]], span: tuple[float, float] | None,
            edges: tuple[float, float] | None) -> tuple[list[tuple[int, float, float, str]], int]:
    """The items that start inside the whole steps; without steps, those not cut by the
    window's edges (a wait the profiler's stop cut short, or one it caught midway). Also how
    many were left out."""
    if span is not None:
        lo, hi = span
        kept = [it for it in items if lo <= it[1] < hi]
    elif edges is not None:
        lo, hi = edges[0] + EDGE_US, edges[1] - EDGE_US
        kept = [it for it in items if it[1] > lo and it[1] + it[2] < hi]
    else:
        kept = items
    return kept, len(items) - len(kept)


def _trace_edges(raw: RawTrace) -> tuple[float, float] | None:
    if raw.trace_window is not None:
        return raw.trace_window
    return (raw.span_ts, raw.span_end) if raw.span_end > raw.span_ts else None


def _host_device(kind: str) -> bool:
    return "HtoD" in kind or "DtoH" in kind or "HtoH" in kind


def _busy_bins(busy: list[tuple[float, float]], bins: int = 120) -> dict[str, Any]:
    """GPU busy share per time bin, for the timeline chart."""
    if not busy:
        return {"bin_us": 0, "busy_pct": []}
    t0, t1 = busy[0][0], busy[-1][1]
    width = (t1 - t0) / bins or 1.0
    acc = [0.0] * bins
    for s, e in busy:
        b = int((s - t0) / width)
        while s < e and b < bins:
            edge = t0 + (b + 1) * width
            acc[b] += min(e, edge) - s
            s = edge
            b += 1
    return {"bin_us": round(width, 3), "busy_pct": [round(100 * a / width, 2) for a in acc]}
