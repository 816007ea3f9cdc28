"""CPU-side nesting per thread: operators' self time, and "who called this" for a point in time.

Traces are nearly sorted by start time per thread (a handful of events out of place in 100 k),
so a thread is re-sorted only when the loader saw it out of order; Timsort makes that cheap.

Nesting is recorded to ``MAX_DEPTH`` levels: deeper spans hang from the span at that depth. A
question about a point then walks at most that many parents, whatever the file (a trace of 250 k
identical or nested operators nests 250 k deep: walking all of it for each of the 2 000 points
asked about cost 16 KB and 0.3 ms per event, issue 19). Real traces nest < 50 deep.
"""

from __future__ import annotations

import re
import sys
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

from flight_profiler.report.trace_loader import CPU_OP, PY_FRAME, RawTrace, ThreadIntervals

# Python frames (with_stack) plus operators: ~45 deep in the CPU fixtures, 10 in the GPU ones;
# deep user recursion stays far below. Past it, spans hang from the span at this depth.
MAX_DEPTH = 256
_FRAME_RE = re.compile(r"^(.*)\((\d+)\): (.*)$")

# -- whose code a frame is: the program's, the standard library's, or an installed library's --
PROGRAM, STDLIB, LIBRARY = "program", "stdlib", "library"
# the agent's own code, staged or generated, is never the program's line ("eval-with-grad named
# 'called from step_marks.py on_enter'")
_LIBRARY_MARKERS = ("site-packages/", "dist-packages/", "flight_profiler/agent", "/torch/",
                    "/flight_profiler-", "<flight_profiler")
_STDLIB_DIR = re.compile(r"/lib(?:64)?/python3(?:\.\d+)?t?/")
# Where the path has no directory to tell (torch's traces strip sys.path prefixes:
# ``threading.py(327): wait``, ``multiprocessing/queues.py(98): get``), the first name decides;
# these stdlib names are also common names of users' own scripts, so they decide nothing.
_AMBIGUOUS = frozenset({"test", "tests", "code", "profile", "trace", "cmd", "this", "token"})
_STDLIB_FALLBACK = frozenset({  # Python 3.9 has no sys.stdlib_module_names: the usual suspects
    "abc", "argparse", "ast", "asyncio", "bdb", "codecs", "collections", "concurrent",
    "contextlib", "copy", "copyreg", "dataclasses", "enum", "functools", "genericpath", "gzip",
    "http", "importlib", "inspect", "io", "json", "linecache", "logging", "multiprocessing", "os",
    "pathlib", "pdb", "pickle", "posixpath", "queue", "random", "re", "runpy", "sched",
    "selectors", "shutil", "signal", "socket", "socketserver", "sre_compile", "ssl",
    "statistics", "subprocess", "tempfile", "threading", "time", "traceback", "types", "typing",
    "unittest", "urllib", "warnings", "weakref", "zipfile", "zipimport",
})
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", _STDLIB_FALLBACK)) - _AMBIGUOUS


def frame_origin(path: str) -> str:
    """Whose code ``path`` is: PROGRAM (the user's own files), STDLIB, or LIBRARY (installed
    packages, torch, our agent). Works on absolute paths (``stack``) and on the sys.path-relative
    ones of torch's traces."""
    p = path.replace("\\", "/")
    if p.startswith("<flight_profiler"):
        return LIBRARY  # the agent's generated hook wrappers
    if p.startswith("<") or not p:
        # <frozen importlib._bootstrap>, <built-in method ...>, <string>: not a file of the program
        return STDLIB if p.startswith(("<frozen", "<built-in")) or not p else PROGRAM
    if "flight_profiler/workloads/" in p:
        return PROGRAM  # the bundled sample programs stand for a user's own code
    if any(m in p for m in _LIBRARY_MARKERS) or p.startswith(("torch/", "flight_profiler/")):
        return LIBRARY
    if _STDLIB_DIR.search(p):
        return STDLIB
    if not p.startswith("/"):
        head = p.split("/", 1)[0]
        name = head[:-3] if head.endswith(".py") else head
        if name in _STDLIB_NAMES:
            return STDLIB
    # Relative names of installed packages other than torch (``transformers/...``) cannot be
    # told from the program's own package once the trace stripped their site-packages prefix.
    return PROGRAM


def program_frame(paths: Sequence[str]) -> int | None:
    """Index of the innermost frame of the program's own code (``paths`` outermost first), or
    None when the stack has none (a thread of a library, a program installed as a package)."""
    for i in range(len(paths) - 1, -1, -1):
        if frame_origin(paths[i]) == PROGRAM:
            return i
    return None


def where_frame(paths: Sequence[str]) -> tuple[int, list[int]]:
    """The frame to show a user as "where" and the frames that give it context.

    Where = the innermost frame of the program's own code (``wait_for_batch`` at train.py:97,
    not ``Condition.wait`` at threading.py:327); without one, the innermost frame outside the
    standard library (a trainer library's line), else the innermost. Context = the frames inside
    it (what it is blocked in: ``Queue.get``, ``Condition.wait``), innermost last. An empty
    stack gives (-1, [])."""
    if not paths:
        return -1, []
    at = program_frame(paths)
    if at is None:
        at = next((i for i in range(len(paths) - 1, -1, -1)
                   if frame_origin(paths[i]) != STDLIB), len(paths) - 1)
    return at, list(range(at + 1, len(paths)))



def is_user_frame(name: str) -> bool:
    """A trace's Python frame (``train.py(57): train_step``) is the program's own code."""
    m = _FRAME_RE.match(name)
    if m is None:
        return False
    return frame_origin(m.group(1)) == PROGRAM


def frame_location(name: str) -> str:
    """``train.py(57): train_step`` -> ``train.py:57 (train_step)``."""
    m = _FRAME_RE.match(name)
    if m is None:
        return name
    return f"{m.group(1)}:{m.group(2)} ({m.group(3)})"


def _order(th: ThreadIntervals) -> Sequence[int]:
    """Span indices by start time, the longer (parent) first at equal starts; cached."""
    if th.sorted:
        return range(len(th.ts))
    if th.order is None:
        # Two stable C-keyed sorts instead of one tuple key: 3x faster on a million spans.
        idx = sorted(range(len(th.ts)), key=th.end.__getitem__, reverse=True)
        idx.sort(key=th.ts.__getitem__)
        th.order = idx
    return th.order


@dataclass
class _Nested:
    """One thread's spans in start order, each with the index of its enclosing span."""

    ts: Sequence[float]
    end: Sequence[float]
    name: Sequence[int]
    kind: Sequence[int]
    parent: array[int]


def _nest(th: ThreadIntervals) -> _Nested:
    if th.sorted:
        ts, end, name, kind = th.ts, th.end, th.name, th.kind
    else:
        order = _order(th)
        ts = array("d", (th.ts[i] for i in order))
        end = array("d", (th.end[i] for i in order))
        name = array("l", (th.name[i] for i in order))
        kind = array("b", (th.kind[i] for i in order))
    n = len(ts)
    parent = array("l", bytes(8 * n)) if n else array("l")
    stack: list[int] = []
    for p in range(n):
        t0 = ts[p]
        while stack and end[stack[-1]] <= t0:
            stack.pop()
        parent[p] = stack[-1] if stack else -1
        if len(stack) < MAX_DEPTH:  # parent chains stay <= MAX_DEPTH + 1 long
            stack.append(p)
    return _Nested(ts, end, name, kind, parent)


@dataclass
class CallerIndex:
    """Answers, for (thread, time) points: which operators and Python frames were open there.

    Built once per thread on first use (one sweep records each span's parent); then a point is
    a binary search for the last span started before it and a walk up its parents."""

    raw: RawTrace

    def __post_init__(self) -> None:
        self._nested: dict[int, _Nested | None] = self.raw.nested

    def _thread(self, key: int) -> _Nested | None:
        if key not in self._nested:
            th = self.raw.threads.get(key)
            self._nested[key] = _nest(th) if th is not None and len(th.ts) else None
        return self._nested[key]

    def resolve(self, points: list[tuple[int, float]],
                annotations: bool = False) -> list[tuple[str | None, list[str]]]:
        """For each (thread key, t): (innermost user frame as file:line, operators
        outermost-first); with ``annotations``, record_function spans (DataLoader,
        Optimizer.step ...) count as operators."""
        all_names = self.raw.names
        out: list[tuple[str | None, list[str]]] = []
        for key, t in points:
            nested = self._thread(key)
            if nested is None:
                out.append((None, []))
                continue
            ts, end, parent = nested.ts, nested.end, nested.parent
            p = bisect_right(ts, t) - 1
            while p >= 0 and end[p] < t:
                p = parent[p]
            user: str | None = None
            ops: list[str] = []
            while p >= 0:  # innermost to outermost
                name = all_names[nested.name[p]]
                kind = nested.kind[p]
                if kind == PY_FRAME:
                    if user is None and is_user_frame(name):
                        user = frame_location(name)
                elif kind == CPU_OP or (annotations and not name.startswith("ProfilerStep")):
                    ops.append(name)
                p = parent[p]
            ops.reverse()
            out.append((user, ops))
        return out


OUTER_STRIDE = 16


def innermost_frame(index: CallerIndex, key: int, t: float) -> str | None:
    """The innermost Python frame (any: program or library) open at (thread, t), or None."""
    nested = index._thread(key)
    if nested is None:
        return None
    p = bisect_right(nested.ts, t) - 1
    while p >= 0 and nested.end[p] < t:
        p = nested.parent[p]
    while p >= 0:
        if nested.kind[p] == PY_FRAME:
            return index.raw.names[nested.name[p]]
        p = nested.parent[p]
    return None


# A count of operators issued one by one must not move with the machine's speed: `state * 0.9`
# on a 32-element column took 2 us on one run and 10-15 us on the next on a 2-core machine
# (1074 to 1599 of the tiny-ops sample's 1715 outer operators under 10 us), while under 20 us
# there were 1604 to 1644.
SMALL_FACTOR = 2.0


def operator_self_times(
    raw: RawTrace, tiny_us: float = 0.0, max_samples: int = 0,
    within: tuple[float, float] | None = None, outer_tiny: list[float] | None = None,
    outer_samples: list[tuple[int, float]] | None = None,
) -> tuple[dict[str, list[float]], list[tuple[int, float, float, str]]]:
    """name -> [calls, total us, self us] for cpu_op events (self = minus nested cpu_ops), and
    up to ``max_samples`` (thread, ts, self us, name) of operators whose self time < tiny_us.
    ``within``: only operators that start in [start, end) (the whole steps). ``outer_tiny``
    ([calls, us], added to): outermost operators (issued from Python, not from inside another
    operator or autograd's backward) whose whole duration is under tiny_us; a third item, if
    given, counts those under SMALL_FACTOR x tiny_us; ``outer_samples`` gets (thread, ts) of
    every OUTER_STRIDE-th of the first."""
    lo, hi = within if within is not None else (float("-inf"), float("inf"))
    small = outer_tiny is not None and len(outer_tiny) > 2
    small_us = tiny_us * SMALL_FACTOR if small else tiny_us
    tiny: list[tuple[int, float, float, str]] = []
    names = raw.names
    # Aggregated by name id in flat lists: no dict lookup or call per operator (1 M-event
    # traces hold ~400 k of them).
    calls = [0] * len(names)
    total_us = [0.0] * len(names)
    self_total = [0.0] * len(names)
    # Sample every k-th operator so that the tiny ones kept are spread over the whole trace.
    total = sum(len(th.ops) for th in raw.threads.values())
    stride = max(1, total // max_samples) if max_samples else 0
    seen = 0
    inf = float("inf")
    for key, th in raw.threads.items():
        ts, end, nm = th.ts, th.end, th.name
        stack: list[list[float]] = []  # [end, name id, duration, children, start]
        # Operators only, by start (the longer first at equal starts); a sentinel (-1, at
        # +inf) closes what is still open.
        ops: Sequence[int] = th.ops
        if not th.sorted:
            ops = sorted(ops, key=end.__getitem__, reverse=True)
            ops.sort(key=ts.__getitem__)
        for i in chain(ops, (-1,)):
            t0 = ts[i] if i >= 0 else inf
            while stack and stack[-1][0] <= t0:
                _e, nid_f, dur_, child, start = stack.pop()
                if not lo <= start < hi:
                    continue
                if outer_tiny is not None and not stack and dur_ < small_us:
                    if small:
                        outer_tiny[2] += 1
                    if dur_ < tiny_us:
                        outer_tiny[0] += 1
                        outer_tiny[1] += dur_
                        if outer_samples is not None and int(outer_tiny[0]) % OUTER_STRIDE == 1:
                            outer_samples.append((key, start))
                nid = int(nid_f)
                self_us = dur_ - child
                if self_us < 0:
                    self_us = 0.0
                calls[nid] += 1
                total_us[nid] += dur_
                self_total[nid] += self_us
                if self_us < tiny_us and stride:
                    seen += 1
                    if seen % stride == 0:
                        tiny.append((key, start, self_us, names[nid]))
            if i < 0:
                break
            dur = end[i] - t0
            if stack:
                stack[-1][3] += dur
            stack.append([end[i], nm[i], dur, 0.0, t0])
    stats: dict[str, list[float]] = {}
    for nid, c in enumerate(calls):
        if c:
            stats[names[nid]] = [c, total_us[nid], self_total[nid]]
    return stats, tiny
