"""Cost of `torch tensors` (the census) on a big process: 1 M Python objects, 10 k tensors.

    /work/venv/bin/python bench/bench_census.py [--objects 1000000] [--tensors 10000] [--json]

Everything is reachable from module globals (the holder walk's worst case: every container is
visited). The census runs in its own thread, as in the agent. Measured in one run:
- wall time of the census (no tracing);
- extra memory: peak of Python allocations during the census (tracemalloc, separate run) and
  the growth of peak RSS (VmHWM, reset through /proc/self/clear_refs) over the same census;
- what the census reported as skipped (budgets);
- a reference in the same run, to read the time as a ratio on a noisy machine: one plain pass
  over the heap (``[type(o) for o in gc.get_objects()]``), the floor of any census.
Aims (issue 5): under 2 s and under 50 MB extra.
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

from flight_profiler.agent import tensor_census  # noqa: E402


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
    t = threading.Thread(target=lambda: box.setdefault("doc", tensor_census.take(torch, seconds=30.0)))
    t.start()
    t.join()
    return box["doc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--tensors", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    world = build(args.objects, args.tensors)
    sys.modules["__main__"].__dict__["world"] = world
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
        "skipped": doc["skipped"],
        "aims": {"census_s": 2.0, "extra_mib": 50},
    }
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
