"""What recording a traced call costs, by recorder, without the rest of trace (hook, event, send).

    python bench/bench_trace_floor.py      # run it with each interpreter to compare

A method making 50 calls of ~1 µs (bench_watch.py's trace-small), run with: an empty Python
profile function; an empty ``_lsprof`` profiler (cProfile's C core, 3.9-3.11: a C profile
function of the calling thread; 3.12+: sys.monitoring); ``_lsprof`` recording caller -> callee
pairs and read back; trace's Python recorder with its tree built. CPU time of the process, best
of alternating rounds, as ratios to the method alone.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import _lsprof

from flight_profiler.agent.commands import trace


def work(x: int) -> int:
    s = 0
    for i in range(30):
        s += i * x
    return s


class Model:
    def step_small(self, n: int) -> int:
        total = 0
        for i in range(50):
            total += work(i)
        return total


MODEL = Model()
CODE = Model.step_small.__code__


def empty(frame: Any, event: str, arg: Any) -> None:
    pass


def bare(n: int) -> float:
    t = time.process_time()
    for i in range(n):
        MODEL.step_small(i)
    return time.process_time() - t


def python_empty(n: int) -> float:
    t = time.process_time()
    for i in range(n):
        sys.setprofile(empty)
        MODEL.step_small(i)
        sys.setprofile(None)
    return time.process_time() - t


def lsprof_empty(n: int) -> float:
    t = time.process_time()
    for i in range(n):
        p = _lsprof.Profiler(builtins=False, subcalls=False)
        p.enable()
        MODEL.step_small(i)
        p.disable()
    return time.process_time() - t


def lsprof_read(n: int) -> float:
    t = time.process_time()
    for i in range(n):
        p = _lsprof.Profiler(builtins=False, subcalls=True)
        p.enable()
        MODEL.step_small(i)
        p.disable()
        p.getstats()
    return time.process_time() - t


def python_recorder(n: int) -> float:
    t = time.process_time()
    for i in range(n):
        profile, root, _info = trace.make_recorder(CODE, False)
        sys.setprofile(profile)
        MODEL.step_small(i)
        sys.setprofile(None)
        trace.build_tree(next(iter(root.values()))[2], 0, trace.MAX_TREE_DEPTH)
    return time.process_time() - t


def main() -> None:
    runs: list[Callable[[int], float]] = [bare, python_empty, lsprof_empty, lsprof_read, python_recorder]
    best = {run.__name__: float("inf") for run in runs}
    for _ in range(7):
        for run in runs:
            best[run.__name__] = min(best[run.__name__], run(2000))
    base = best["bare"]
    print(sys.version.split()[0], f"step {base / 2000 * 1e6:.1f} µs;",
          ", ".join(f"{name} {value / base:.2f}x" for name, value in best.items() if name != "bare"))


if __name__ == "__main__":
    main()
