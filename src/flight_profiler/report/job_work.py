"""Where one rank's training thread spends its window: its own work, and waiting for the others.

In a synchronous job every rank's step takes as long as the slowest rank's: the others wait for
it in a collective. Step times therefore cannot tell ranks apart; their own work and their waits
can. From a torch.profiler trace (Python frames recorded: ``with_stack``), on the thread that ran
the most operators:

- ``wait``: blocked on the other ranks: inside an explicit collective (a ``distributed_c10d.py``
  frame, ``c10d::`` operators), or, for DDP, inside ``backward`` without running an operator (its
  gradient all-reduce runs in C++ autograd hooks and backward waits for it at the end; CPU
  traces only: on a GPU the operators run on the device's own thread); either only while a
  collective is in flight on the backend (its ``gloo:*`` / ``nccl:*`` span, NCCL kernels) when
  the trace has those spans: a thread starved of CPU or of the GIL is not waiting for a rank;
- ``data``: in the DataLoader's ``__next__``;
- ``sleep``: in ``time.sleep``;
- ``blocked``: in another blocking call (a queue, a lock, a condition, select): waiting for
  another thread of the rank; ``data_elsewhere_pct`` says how much of the window another thread
  spent in the DataLoader (a prefetch thread feeding the queue);
- ``compute``: running operators, outside the above;
- ``other``: the rest (Python between operators).

The window is the trace's steps (``ProfilerStep``) when it has some, else its whole span. The
program's lines behind each kind come from samples of the thread's stack every ``window /
_SAMPLES`` (the innermost frame of the program's own code). All times are microseconds.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from flight_profiler.report.stacks import CallerIndex
from flight_profiler.report.trace_loader import ANNOTATION, COMM, CPU_OP, PY_FRAME, RawTrace

Intervals = list[tuple[float, float]]

KINDS = ("wait", "data", "sleep", "blocked", "compute", "other")
_SAMPLES = 4000
_C10D_FRAME = "distributed_c10d.py("
_BACKWARD = ("<built-in method run_backward", "torch/autograd/graph.py(")
_DDP_MARKERS = ("reducer::", "ddp.reducer", "DistributedDataParallel.forward")
# Python's blocking calls as torch's tracer names them ("<built-in method acquire of _thread.lock
# object at 0x...>"): waits for another thread, a socket, a pipe.
_BLOCKING = ("acquire", "select", "poll", "recv", "read", "wait", "join", "accept", "get")


def merge(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b`` (both merged and sorted)."""
    out: Intervals = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def intersect(a: Intervals, b: Intervals) -> Intervals:
    return subtract(a, subtract(a, b))


def intersect_points(spans: Intervals, window: Intervals) -> list[float]:
    """The starts of ``spans`` that fall inside ``window``."""
    starts = [s for s, _ in window]
    out = []
    for s, _e in spans:
        i = bisect_right(starts, s) - 1
        if i >= 0 and s < window[i][1]:
            out.append(s)
    return out


def length(a: Intervals) -> float:
    return sum(e - s for s, e in a)


def _inside(points: list[float], iv: Intervals) -> list[bool]:
    starts = [s for s, _ in iv]
    out = []
    for t in points:
        i = bisect_right(starts, t) - 1
        out.append(i >= 0 and t < iv[i][1])
    return out


def _blocking_builtin(name: str) -> bool:
    if not name.startswith("<built-in"):
        return False
    head = name.split(" of ", 1)[0]
    word = head.rsplit(" ", 1)[-1].rstrip(">")
    return word in _BLOCKING or word.endswith(("acquire", "_wait"))


def _training_thread(raw: RawTrace) -> int | None:
    """The thread that ran the most operators (merged time): the one doing the step."""
    best, best_us = None, 0.0
    for key, th in raw.threads.items():
        ops = merge([(th.ts[i], th.end[i]) for i in th.ops])
        us = length(ops)
        if us > best_us:
            best, best_us = key, us
    return best


def _window(raw: RawTrace) -> Intervals:
    if raw.steps:
        return merge([(ts, ts + dur) for _, ts, dur in raw.steps if dur > 0])
    # The profiler's own window when the trace says it: an event left open at the stop can
    # end far later (seen: a 1.5 s window spanning 2.7 s), time no thread of it recorded.
    start, end = raw.trace_window or (raw.span_ts, raw.span_end)
    return [(start, end)] if end > start else []


def _steps(raw: RawTrace, key: int) -> int:
    if raw.steps:
        return len(raw.steps)
    th = raw.threads[key]
    names = raw.names
    counts: dict[str, int] = {}
    for i in range(len(th.ts)):
        if th.kind[i] == ANNOTATION:
            n = names[th.name[i]]
            if n.startswith(("Optimizer.step#", "DistributedDataParallel.forward")):
                counts[n.split("#", 1)[0]] = counts.get(n.split("#", 1)[0], 0) + 1
    return max(counts.values()) if counts else 0


# An event's class for training_work: which list its span joins (an index into its tuple of
# lists, 0 for none), whether it is an operator, a Python frame, or marks DDP.
_LIST = 0x7
_OP, _PY, _DDP = 0x8, 0x10, 0x20
_SKIP = 0
_TO_COLL, _TO_BACKWARD, _TO_DATA, _TO_SLEEP, _TO_BLOCKED = 1, 2, 3, 4, 5


def _classify(kind: int, name: str) -> int:
    if kind == CPU_OP:
        if name.startswith("c10d::"):
            return _OP | _TO_COLL
        return _OP | (_DDP if any(m in name for m in _DDP_MARKERS) else 0)
    if kind == PY_FRAME:
        if _C10D_FRAME in name:
            return _PY | _TO_COLL
        if name.startswith(_BACKWARD):
            return _PY | _TO_BACKWARD
        if name == "<built-in function sleep>":
            return _PY | _TO_SLEEP
        if "torch/utils/data/dataloader.py(" in name and name.endswith("__next__"):
            return _PY | _TO_DATA
        if _blocking_builtin(name):
            return _PY | _TO_BLOCKED
        return _PY
    if kind == ANNOTATION:
        if name.startswith("enumerate(DataLoader)"):
            return _TO_DATA
        if name.startswith("DistributedDataParallel.forward"):
            return _DDP
    return _SKIP


def training_work(raw: RawTrace) -> dict[str, Any] | None:
    """The training thread's window split into KINDS, with the program's lines behind each."""
    key = _training_thread(raw)
    window = _window(raw)
    if key is None or not window:
        return None
    th = raw.threads[key]
    names = raw.names
    coll: Intervals = []
    backward: Intervals = []
    data: Intervals = []
    sleep: Intervals = []
    blocked: Intervals = []
    ops: Intervals = []
    ddp = False
    python_frames = False
    # What an event is depends only on its kind and name: classified once per (kind, name id),
    # not once per event (a with_stack trace of 3 LBFGS steps: 350,000 events, ~6,000 names).
    classes: dict[tuple[int, int], int] = {}
    lists: tuple[Intervals, ...] = (ops, coll, backward, data, sleep, blocked)
    ts, end, kinds, ids = th.ts, th.end, th.kind, th.name
    for i in range(len(ts)):
        key_ = (kinds[i], ids[i])
        cls = classes.get(key_)
        if cls is None:
            cls = classes[key_] = _classify(key_[0], names[key_[1]])
        if cls == _SKIP:
            continue
        if cls & _PY:
            python_frames = True
        if cls & _DDP:
            ddp = True
        span = (ts[i], end[i])
        if cls & _OP:
            ops.append(span)
        target = cls & _LIST
        if target:
            lists[target].append(span)
    ops_m = merge(ops)
    taken: Intervals = []
    parts: dict[str, Intervals] = {}
    wait = merge(coll)
    if backward and not raw.g_ts:
        # Inside backward without an operator running: waiting for the gradient all-reduce
        # (DDP), which ends backward. On a GPU the operators run on the device's thread.
        wait = merge(wait + subtract(merge(backward), ops_m))
    flight = _in_flight(raw)
    if flight:
        # ... while a collective is in flight (the backend's span, on its own thread): a thread
        # starved of CPU or of the GIL in backward, or back from a collective but waiting for
        # the GIL, is not waiting for the other ranks.
        wait = intersect(wait, flight)
    for name, iv in (("wait", wait), ("data", merge(data)), ("sleep", merge(sleep)),
                     ("blocked", merge(blocked)), ("compute", ops_m)):
        mine = subtract(intersect(iv, window), taken)
        parts[name] = mine
        taken = merge(taken + mine)
    window_us = length(window)
    parts["other"] = subtract(window, taken)
    out: dict[str, Any] = {f"{k}_us": round(length(parts[k]), 3) for k in KINDS}
    steps = _steps(raw, key)
    out.update({
        "thread": key, "window_us": round(window_us, 3), "steps": steps,
        # Operators run in the window: more of them per step is more work; the same number taking
        # longer is the same work running slower (a busy host, bigger inputs).
        "ops": len(intersect_points(ops, window)),
        "step_us": round(window_us / steps, 3) if steps else None,
        "ddp": ddp, "python_frames": python_frames, "window_kind": "steps" if raw.steps else "trace",
        "wait_from": ("ddp" if ddp and backward else "collective") if wait else None,
        "data_elsewhere_pct": round(_data_elsewhere(raw, key, window, window_us), 2),
        "lines": _lines(raw, key, window, parts),
    })
    return out


def _in_flight(raw: RawTrace) -> Intervals:
    """When a collective was in flight: the backends' spans (``gloo:all_reduce`` on gloo's
    thread, ``nccl:*``) and NCCL kernels, from the call's start on the backend to its end."""
    spans: Intervals = []
    names = raw.names
    backend = [n.startswith(("gloo:", "nccl:")) for n in names]  # once per name, not per event
    for th in raw.threads.values():
        kinds, ids = th.kind, th.name
        for i in range(len(th.ts)):
            if backend[ids[i]] and kinds[i] != PY_FRAME:
                spans.append((th.ts[i], th.end[i]))
    for i in range(len(raw.g_ts)):
        if raw.g_kind[i] == COMM:
            spans.append((raw.g_ts[i], raw.g_end[i]))
    return merge(spans)


def _data_elsewhere(raw: RawTrace, key: int, window: Intervals, window_us: float) -> float:
    """The largest share of the window another thread spent in the DataLoader's __next__."""
    per: dict[int, Intervals] = {}
    for k, ts, dur in raw.dataloader:
        if k != key:
            per.setdefault(k, []).append((ts, ts + dur))
    best = max((length(intersect(merge(iv), window)) for iv in per.values()), default=0.0)
    return 100.0 * best / window_us if window_us > 0 else 0.0


def _lines(raw: RawTrace, key: int, window: Intervals, parts: dict[str, Intervals]) -> list[dict[str, Any]]:
    """Per kind, the program's lines the thread was at, from evenly spaced samples: the top
    ones with their share of the window."""
    total = length(window)
    if total <= 0:
        return []
    step = total / _SAMPLES
    points: list[float] = []
    for s, e in window:  # evenly spaced over the window's pieces
        t = s + step / 2
        while t < e:
            points.append(t)
            t += step
    if not points:
        return []
    where = [w for w, _ in CallerIndex(raw).resolve([(key, t) for t in points])]
    counts: dict[tuple[str, str], int] = {}
    for kind in KINDS:
        for inside, w in zip(_inside(points, parts[kind]), where):
            if inside:
                k = (kind, w or "(no frame of the program)")
                counts[k] = counts.get(k, 0) + 1
    share = 100.0 / len(points)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    return [{"kind": k, "where": w, "pct": round(n * share, 2)} for (k, w), n in ranked[:24]]
