"""How long a full `flight_profiler diagnose` takes, and what it costs the job it diagnoses.

Starts a sample workload (default: healthy) that prints its mean step time every 0.25 s, lets it
run, then runs the diagnosis (the real CLI, as a user would) and measures:

- the diagnosis' wall time and each phase's time (from its diagnose.json);
- the workload's mean step time before, during and after the diagnosis, as ratios to "before"
  in the same run (the machine is shared and noisy: only ratios within one run mean anything).

    /work/venv/bin/python bench/bench_diagnose.py [--workload healthy] [--calls 10] [--duration 5]
                                                   [--settle 5] [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from flight_profiler.diagnose.launch import Workload, start_workload


def mean_step_ms(beats: list[tuple[int, float]]) -> float:
    """Step-weighted mean of heartbeat averages (each line covers the steps since the last)."""
    if not beats:
        return float("nan")
    steps = [b[0] - a[0] for a, b in zip([(0, 0.0), *beats], beats)]
    total = sum(s * ms for s, (_, ms) in zip(steps, beats))
    return total / max(1, sum(steps))


class BeatClock:
    """Timestamps each heartbeat line as it appears (polled every 20 ms), so that step times can
    be attributed to the diagnosis phase that was running."""

    def __init__(self, job: Workload) -> None:
        self.job = job
        self.seen: list[tuple[float, int, float]] = []  # (time.time(), step, avg_ms)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            beats = self.job.heartbeats()
            now = time.time()
            for step, ms in beats[len(self.seen):]:
                self.seen.append((now, step, ms))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def by_phase(seen: list[tuple[float, int, float]], phases: list[dict[str, Any]]) -> dict[str, float]:
    """Mean step ms of the heartbeats that fell inside each phase (phases of >= 0.5 s only)."""
    out = {}
    for p in phases:
        start, end = p["started"], p["started"] + p["seconds"]
        if p["seconds"] < 0.5:
            continue
        inside = [(step, ms) for t, step, ms in seen if start + 0.25 <= t <= end]
        if inside:
            out[p["name"]] = round(statistics.fmean(ms for _, ms in inside), 3)
    return out


def one_run(args: argparse.Namespace, tmp: Path, index: int) -> dict[str, Any]:
    job: Workload = start_workload(args.workload, str(tmp / f"workload-{index}.log"),
                                   ["--heartbeat", "0.25"])
    try:
        target = job.wait_ready(90)
        clock = BeatClock(job)
        time.sleep(args.settle)
        n0 = len(job.heartbeats())
        out = tmp / f"diag-{index}"
        cmd = [sys.executable, "-m", "flight_profiler", "diagnose", str(job.pid),
               *target.words.split(), "--out", str(out), "--calls", str(args.calls),
               "--duration", str(args.duration), "--json"]
        started, t_start = time.perf_counter(), time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wall, t_end = time.perf_counter() - started, time.time()
        n1 = len(job.heartbeats())
        time.sleep(args.settle)
        beats = job.heartbeats()
        clock.stop()
    finally:
        job.stop()
    if proc.returncode != 0:
        raise SystemExit(f"diagnose failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    # Skip the first heartbeat after READY (warm-up) and one at each boundary (mixed intervals).
    before = beats[1:n0]
    during = beats[n0 + 1:n1]
    after = beats[n1 + 1:]
    b, d, a = mean_step_ms(before), mean_step_ms(during), mean_step_ms(after)
    # The attach (CLI start, injection) and the phases, apart: injecting with gdb stops the target.
    t_phases = result["phases"][0]["started"] if result["phases"] else t_end
    window = {"attach": (t_start, t_phases), "phases": (t_phases, t_end)}
    split = {}
    for key, (lo, hi) in window.items():
        inside = [ms for t, _, ms in clock.seen if lo + 0.25 <= t <= hi]
        split[key] = {"mean_step_ms": round(statistics.fmean(inside), 3) if inside else None,
                      "worst_heartbeat_ms": round(max(inside), 3) if inside else None}
    return {
        "wall_s": round(wall, 2),
        "attach_s": result.get("attach_seconds"),
        "workflow_s": result.get("seconds"),
        "phases_s": {p["name"]: p["seconds"] for p in result["phases"]},
        "not_ok": {p["name"]: f"{p['status']}: {p['reason']}" for p in result["phases"]
                   if p["status"] != "ok" and not p["reason"].startswith("no CUDA")},
        "step_ms": {"before": round(b, 3), "during": round(d, 3), "after": round(a, 3)},
        "ratio_during": round(d / b, 2), "ratio_after": round(a / b, 2),
        "step_ms_by_phase": by_phase(clock.seen, result["phases"]),
        "attach_vs_phases": split,
        "heartbeats": {"before": len(before), "during": len(during), "after": len(after)},
        "findings": [f"{f['severity']} {f['rule']}" for f in result["findings"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workload", default="healthy")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before and after")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fp-bench-diagnose-") as tmp:
        runs = [one_run(args, Path(tmp), i) for i in range(args.repeat)]
    if args.json:
        print(json.dumps({"workload": args.workload, "calls": args.calls,
                          "duration": args.duration, "runs": runs}, indent=2))
        return
    print(f"diagnose of `{args.workload}` (--calls {args.calls} --duration {args.duration:g}), "
          f"{len(runs)} run(s)")
    for i, r in enumerate(runs, 1):
        s = r["step_ms"]
        print(f"run {i}: wall {r['wall_s']:.2f} s (attach {r['attach_s']:.2f} s, phases+report "
              f"{r['workflow_s']:.2f} s); step {s['before']:.3f} ms before, "
              f"{s['during']:.3f} ms during (x{r['ratio_during']:.2f}), {s['after']:.3f} ms after "
              f"(x{r['ratio_after']:.2f}); findings: {', '.join(r['findings']) or 'none'}")
        for name, why in r["not_ok"].items():
            print(f"       phase {name} {why}")
        slow = sorted(r["phases_s"].items(), key=lambda kv: -kv[1])[:5]
        print("       slowest phases: " + ", ".join(f"{n} {t:.2f}s" for n, t in slow))
        base = s["before"]
        for key, v in r["attach_vs_phases"].items():
            if v["mean_step_ms"] is not None:
                print(f"       during {key}: mean step {v['mean_step_ms']:.2f} ms "
                      f"(x{v['mean_step_ms'] / base:.2f}), worst 0.25 s interval "
                      f"{v['worst_heartbeat_ms']:.1f} ms/step")
        print("       step time inside phases: " + ", ".join(
            f"{n} {ms:.2f} ms (x{ms / base:.2f})" for n, ms in r["step_ms_by_phase"].items()))
    if len(runs) > 1:
        print(f"median wall {statistics.median(r['wall_s'] for r in runs):.2f} s, median slowdown "
              f"during x{statistics.median(r['ratio_during'] for r in runs):.2f}")


if __name__ == "__main__":
    main()
