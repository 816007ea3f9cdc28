"""What the agent's JSON writes cost a busy target, measured in one run (ratios: machines are noisy).

    .venv/bin/python bench/bench_agent_writes.py [--events 20000] [--runs 3]

A trace-shaped document written by the agent's writer (gzip) while another thread spins in
Python (a busy target), against the same write alone; and the same with the writer's old way,
one write per JSON token (each write releases the GIL, and the spinning thread then holds it for
a whole switch interval).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from flight_profiler.agent import torch_support  # noqa: E402


def trace(n: int) -> dict[str, Any]:
    return {"traceEvents": [{"ph": "X", "name": f"aten::op{i % 50}", "ts": i * 1.5, "dur": 1.0,
                             "pid": 1, "tid": 2, "args": {"stack": ["a.py(1): f", "b.py(2): g"]}}
                            for i in range(n)]}


def per_token(path: str, obj: Any) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as gz:
        for chunk in json.JSONEncoder(separators=(",", ":"), default=str).iterencode(obj):
            gz.write(chunk.encode("utf-8"))


def timed(write: Callable[[str, Any], Any], path: str, obj: Any, busy: bool, runs: int) -> float:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    hog = threading.Thread(target=spin, daemon=True)
    if busy:
        hog.start()
    try:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            write(path, obj)
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        stop.set()
        if busy:
            hog.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    obj = trace(a.events)
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "t.json.gz")
        for name, write in (("blocks (now)", torch_support.write_json), ("per token (before)", per_token)):
            alone = timed(write, path, obj, False, a.runs)
            busy = timed(write, path, obj, True, a.runs)
            print(f"{name:20s} alone {alone:6.2f} s   beside a busy thread {busy:6.2f} s   "
                  f"ratio {busy / alone:4.1f}x")


if __name__ == "__main__":
    main()
