"""Overhead of `torch profile` method mode on a small training step, in one run (ratios).

    /work/venv/bin/python bench/bench_profile.py [--calls 30] [--json]

The training step (MLP 256-512-256-10, batch 64, SGD) runs in the main thread, as in a job; the
handler runs in its own thread, as in the agent. Per-call time is the median over the calls the
profiler recorded (and the ratio of the fastest calls, the least noisy figure), against the
median of unprofiled calls measured just before while an idle
thread waits (as the agent's do: on this shared machine any second thread already makes some
calls take a scheduler slice longer, so the baseline must have one too), for: the
default options, --with-stack, and --record-shapes --profile-memory --with-stack. Also the time
from the last recorded call to the trace on disk (export + operator table, in the agent's
thread) as a ratio to one step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from flight_profiler.agent import hooks, registry  # noqa: E402

WORKLOAD = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                            torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()

def train_step(x, y):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()
"""


def load_workload() -> types.ModuleType:
    module = types.ModuleType("bench_profile_workload")
    sys.modules[module.__name__] = module
    exec(compile(WORKLOAD, "bench_profile_workload.py", "exec"), module.__dict__)
    return module


def timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def baseline(work: types.ModuleType, batch: Any, calls: int) -> list[float]:
    stop = threading.Event()
    idle = threading.Thread(target=lambda: [None for _ in iter(lambda: stop.wait(0.1), True)])
    idle.start()
    try:
        return [timed(work.train_step, *batch) for _ in range(calls)]
    finally:
        stop.set()
        idle.join()


def profiled_run(work: types.ModuleType, batch: Any, calls: int, options: dict[str, Any],
                 out: Path) -> tuple[list[float], float]:
    """(per-call seconds of the recorded calls, seconds from the last call to the result)."""
    box: dict[str, Any] = {}
    args = {"target": {"module": work.__name__, "class": None, "method": "train_step", "nested": None},
            "calls": calls, "path": str(out), **options}

    def run() -> None:
        box["result"] = registry.run(registry.Context(args), "torch profile")
        box["done"] = time.perf_counter()

    thread = threading.Thread(target=run)
    thread.start()
    while not hooks.active():
        time.sleep(0.001)
    recorded = [timed(work.train_step, *batch) for _ in range(calls)]
    last = time.perf_counter()
    thread.join()
    assert box["result"]["calls_recorded"] == calls
    return recorded, box["done"] - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared 2-core machine
    work = load_workload()
    batch = (torch.randn(64, 256), torch.randint(0, 10, (64,)))
    for _ in range(20):
        work.train_step(*batch)
    variants = {
        "default": {},
        "with_stack": {"with_stack": True},
        "shapes+memory+stack": {"record_shapes": True, "profile_memory": True, "with_stack": True},
    }
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in variants.items():
            plain = baseline(work, batch, args.calls)
            recorded, finish = profiled_run(work, batch, args.calls, options, Path(tmp) / f"{name}.json.gz")
            base, prof = statistics.median(plain), statistics.median(recorded)
            rows[name] = {"step_ms": round(base * 1000, 3), "profiled_step_ms": round(prof * 1000, 3),
                          "ratio": round(prof / base, 2),
                          # the fastest call of each: what the profiler costs, without the noise
                          "min_ratio": round(min(recorded) / min(plain), 2),
                          # each recorded call is its own profiler session (call_window.py):
                          # a fixed start+stop cost per call, whatever the step's length
                          "added_ms_per_call": round((min(recorded) - min(plain)) * 1000, 2),
                          "first_call_ratio": round(recorded[0] / base, 1),
                          "export_ms": round(finish * 1000, 1)}
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'variant':<22}{'step ms':>10}{'profiled':>10}{'ratio':>8}{'min ratio':>11}{'+ms/call':>10}"
          f"{'1st call':>10}{'export ms':>11}")
    for name, r in rows.items():
        print(f"{name:<22}{r['step_ms']:>10}{r['profiled_step_ms']:>10}{r['ratio']:>8}{r['min_ratio']:>11}"
              f"{r['added_ms_per_call']:>10}{r['first_call_ratio']:>10}{r['export_ms']:>11}")


if __name__ == "__main__":
    main()
