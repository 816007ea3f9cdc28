"""The first profiler session of a process against the next ones, each in a fresh process: what
a warm-up call would buy in `torch profile METHOD` per-call sessions (agent/commands/
torch_profile.py skips it on CPU).

    .venv/bin/python bench/bench_first_session.py [--processes 4] [--sessions 4]

Each process trains a small MLP 20 steps unprofiled (the baseline is the next 20), then runs
--sessions sessions with the agent's own start/stop (profiler_sessions.start_profiler: inductor
left alone, no thread switch) around one step each, with profile_memory and with_stack as
diagnose asks. Prints, per process, the start time of each session and the step time inside
it as a ratio to the unprofiled step; then the medians of the first session and of the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from flight_profiler.agent.profiler_sessions import start_profiler, stop_profiler
m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
x = torch.randn(64, 256)
def step():
    m(x).sum().backward()
for _ in range(20):
    step()
t = time.perf_counter()
for _ in range(20):
    step()
base = (time.perf_counter() - t) / 20
out = []
for _ in range(int(sys.argv[2])):
    p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                               profile_memory=True, with_stack=True)
    t0 = time.perf_counter(); start_profiler(p); t1 = time.perf_counter()
    step(); t2 = time.perf_counter(); stop_profiler(p)
    out.append({"start_ms": (t1 - t0) * 1e3, "step_ratio": (t2 - t1) / base})
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=4)
    args = ap.parse_args()
    first: list[dict[str, float]] = []
    rest: list[dict[str, float]] = []
    for k in range(args.processes):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "src"), str(args.sessions)],
                              capture_output=True, text=True, timeout=300, check=True)
        sessions = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"process {k}: " + ", ".join(f"start {s['start_ms']:.1f} ms step x{s['step_ratio']:.2f}"
                                           for s in sessions))
        first.append(sessions[0])
        rest.extend(sessions[1:])
    for label, group in (("first session", first), ("later sessions", rest)):
        if group:
            print(f"{label}: start {statistics.median(s['start_ms'] for s in group):.1f} ms, step "
                  f"x{statistics.median(s['step_ratio'] for s in group):.2f} of unprofiled (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
