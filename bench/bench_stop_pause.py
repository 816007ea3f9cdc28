"""How long the target's Python threads stop while an all-threads with_stack profiler session
is stopped: torch's post-processing in ``prof.stop()`` holds the GIL.

    .venv/bin/python bench/bench_stop_pause.py [--sessions 3] [--window 1.5] [--plain]

One process runs the character RNN of tests/integration/real_programs (a dense loop: ~100,000
profiler events a step) in a thread, and a second thread stamps the clock every millisecond.
Each session lasts --window seconds and is stopped with the agent's own stop_profiler (other
Python threads held off, agent/profiler_sessions.py), or with a bare ``prof.stop()`` with
--plain. Prints each stop's length and the longest gap between stamps across it (the window's
edges included): the pause the job sees.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "tests" / "integration" / "real_programs" / "char_rnn_generation.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--window", type=float, default=1.5)
    ap.add_argument("--plain", action="store_true", help="a bare prof.stop(), not the agent's")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import torch

    from flight_profiler.agent.profiler_sessions import start_profiler, stop_profiler

    def train() -> None:
        sys.argv = [str(PROGRAM), "--seconds", "600"]
        with contextlib.suppress(SystemExit):
            runpy.run_path(str(PROGRAM), run_name="__main__")

    stamps: list[float] = []

    def stamp() -> None:
        while True:
            stamps.append(time.monotonic())
            time.sleep(0.001)

    # the program prints as it trains: its output would bury the figures
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
    threading.Thread(target=train, daemon=True).start()
    threading.Thread(target=stamp, daemon=True).start()
    time.sleep(6)  # past the program's start-up
    for n in range(args.sessions):
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      with_stack=True, profile_memory=True, experimental_config=config)
        start_profiler(prof)
        time.sleep(args.window)
        t0 = time.monotonic()
        if args.plain:
            prof.stop()
        else:
            stop_profiler(prof)
        t1 = time.monotonic()
        points = [t0, *(s for s in list(stamps) if t0 <= s <= t1), t1]
        gap = max(b - a for a, b in zip(points, points[1:]))
        print(f"session {n}: stop {t1 - t0:.2f} s, longest pause of the job's threads {gap:.3f} s",
              file=sys.__stdout__, flush=True)
        del prof
        time.sleep(2)
    os._exit(0)  # the training thread runs on


if __name__ == "__main__":
    main()
