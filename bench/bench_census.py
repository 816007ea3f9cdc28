"""Cost of `torch tensors` (the census) on a big process: 1 M Python objects, 10 k tensors.

    /work/venv/bin/python bench/bench_census.py [--objects 1000000] [--tensors 10000] [--json]

Everything is reachable (the holder walk's worst case: every container is visited), from where
users keep data: a third from module globals, a third from main()'s locals, a third from the
locals of a worker thread's running function (frame roots). The census runs as the agent runs
it: in its own thread (named as the agent's), with every other thread held at a safe point
(thread_gate). Measured in one run:
- wall time of the census (no tracing);
- extra memory: peak of Python allocations during the census (tracemalloc, separate run) and
  the growth of peak RSS (VmHWM, reset through /proc/self/clear_refs) over the same census;
- what the census reported as skipped (budgets);
- a reference in the same run, to read the time as a ratio on a noisy machine: one plain pass
  over the heap (``[type(o) for o in gc.get_objects()]``), the floor of any census.
- how long a tensor walk waits for a safe point while a thread runs 2 ms torch steps (the
  worker does back-to-back matmuls of ~2 ms each; 30 walks): median / p90 / max wait, also as
  a multiple of the measured step.
Aims (issues 5 and 11): under 2 s and under 50 MB extra with frame roots; the wait about one
step.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from flight_profiler.agent import tensor_census, thread_gate  # noqa: E402


class Record:
    def __init__(self, i: int) -> None:
        self.i = i
        self.tags = [i]


def build(objects: int, tensors: int) -> dict[str, Any]:
    """About ``objects`` gc-tracked Python objects and ``tensors`` tensors, all reachable."""
    third = objects // 3
    world: dict[str, Any] = {
        "records": [Record(i) for i in range(third // 2)],  # instance + its list: 2 objects each
        "rows": [{"k": i} for i in range(third)],
        "pairs": [[i, i] for i in range(objects - third - 2 * (third // 2))],
        "activations": {i: torch.randn(16) for i in range(tensors // 2)},
        "losses": [torch.randn(()) for _ in range(tensors - tensors // 2)],
    }
    return world


def hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def census_in_thread() -> dict[str, Any]:
    box: dict[str, Any] = {}

    def agent() -> None:
        box["doc"] = thread_gate.run_with_threads_held(
            lambda: tensor_census.take(torch, seconds=30.0), timeout=2.0)

    t = threading.Thread(target=agent, name="flight_profiler-bench")
    t.start()
    t.join()
    return box["doc"]


def holder_thread(part: dict[str, Any], stop: threading.Event) -> threading.Thread:
    """A worker whose running function's locals hold part of the data (a frame root)."""
    def serve_forever() -> None:
        cache = dict(part)
        part.clear()
        stop.wait()
        cache.clear()

    t = threading.Thread(target=serve_forever, name="server", daemon=True)
    t.start()
    return t


def safe_point_wait(walks: int = 30) -> dict[str, Any]:
    """Wait for a safe point while a thread runs ~2 ms torch steps back to back."""
    torch.set_num_threads(1)  # one op = one thread's 2 ms, as a small CPU training step
    size = 128
    while size < 4096:  # grow one matmul until its median time reaches ~2 ms (cost ~ size^3)
        a, b = torch.randn(size, size), torch.randn(size, size)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
        if sorted(times)[3] >= 0.002:
            break
        size = int(size * 1.15)
    stop = threading.Event()
    steps: list[float] = []

    def train() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            torch.mm(a, b)  # one op of ~2 ms: no safe point inside it
            steps.append(time.perf_counter() - t0)

    worker = threading.Thread(target=train, name="trainer")
    worker.start()
    waits: list[float] = []
    try:
        time.sleep(0.2)
        for _ in range(walks):
            box: dict[str, float] = {}

            def agent(box: dict[str, float] = box) -> None:
                t0 = time.perf_counter()
                thread_gate.run_with_threads_held(
                    lambda: box.setdefault("at", time.perf_counter() - t0), timeout=2.0)

            t = threading.Thread(target=agent, name="flight_profiler-bench")
            t.start()
            t.join()
            waits.append(box["at"])
            time.sleep(0.02)
    finally:
        stop.set()
        worker.join()
    waits.sort()
    step = sorted(steps)[len(steps) // 2]
    return {"step_ms": round(step * 1e3, 2), "walks": walks,
            "wait_median_ms": round(waits[len(waits) // 2] * 1e3, 2),
            "wait_p90_ms": round(waits[int(len(waits) * 0.9)] * 1e3, 2),
            "wait_max_ms": round(waits[-1] * 1e3, 2),
            "wait_median_over_step": round(waits[len(waits) // 2] / step, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--tensors", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    world = build(args.objects, args.tensors)
    # A third each: module global, main()'s local, a worker thread's local (frame roots).
    in_main = {k: world.pop(k) for k in ("rows", "losses")}
    in_thread = {k: world.pop(k) for k in ("pairs", "activations")}
    sys.modules["__main__"].__dict__["world"] = world
    stop = threading.Event()
    server = holder_thread(in_thread, stop)
    gc.collect()
    tracked = len(gc.get_objects())

    census_in_thread()  # warm-up: imports, first-call costs
    gc.collect()
    rss_reset = reset_hwm()
    hwm_before = hwm_kib()
    start = time.perf_counter()
    doc = census_in_thread()
    seconds = time.perf_counter() - start
    hwm_growth_mib = (hwm_kib() - hwm_before) / 1024 if rss_reset else None

    ref = []
    for _ in range(3):
        t0 = time.perf_counter()
        types = [type(o) for o in gc.get_objects()]
        ref.append(time.perf_counter() - t0)
        del types
    reference = min(ref)

    tracemalloc.start()
    census_in_thread()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    roots = {h["path"].split(" local ")[0] if " local " in h["path"] else h["path"].split(".")[0]
             for h in doc["holders"]}
    stop.set()
    server.join()
    del in_main
    wait = safe_point_wait()

    result = {
        "gc_tracked_objects": tracked,
        "tensors_found": doc["totals"]["count"],
        "containers_walked": doc.get("walked_objects"),
        "census_s": round(seconds, 3),
        "census_s_reported": doc["elapsed_s"],
        "heap_pass_s": round(reference, 3),
        "census_over_heap_pass": round(seconds / reference, 1),
        "python_peak_extra_mib": round(peak / 2**20, 1),
        "rss_peak_growth_mib": None if hwm_growth_mib is None else round(hwm_growth_mib, 1),
        "holder_roots_seen": sorted(roots)[:6],
        "skipped": doc["skipped"],
        "safe_point": wait,
        "aims": {"census_s": 2.0, "extra_mib": 50},
    }
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
