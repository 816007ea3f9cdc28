"""What staging the agent costs an attach, this tree against another, interleaved in one run.

    .venv/bin/python bench/bench_staging.py [--src OTHER/src] [--rounds 20]

Per tree, in a fresh /tmp-like root each round: the first stage (copy) and the second (reuse:
since issue 19 a copy is reused only after every file is hashed through a checked descriptor).
Rounds alternate between the trees, so machine noise hits both alike; medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ONE_ROUND = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from flight_profiler.attach import staging
root = sys.argv[2]
os.mkdir(os.path.join(root, "tmp"), 0o1777)
t0 = time.perf_counter()
staging.stage(os.geteuid(), 4242, root, None, 77)
t1 = time.perf_counter()
staging.stage(os.geteuid(), 4243, root, None, 77)
t2 = time.perf_counter()
print(json.dumps({"fresh_ms": (t1 - t0) * 1e3, "reuse_ms": (t2 - t1) * 1e3}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="another source tree to compare with (e.g. main's)")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    trees = {"this": str(REPO / "src")}
    if args.src:
        trees["other"] = args.src
    samples: dict[str, dict[str, list[float]]] = {t: {"fresh_ms": [], "reuse_ms": []} for t in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            root = tempfile.mkdtemp(prefix="fp-bench-stage-")
            try:
                out = subprocess.run([sys.executable, "-c", ONE_ROUND, src, root], check=True,
                                     capture_output=True, text=True, timeout=120).stdout
            finally:
                shutil.rmtree(root, ignore_errors=True)
            for key, value in json.loads(out).items():
                samples[name][key].append(value)
    result: dict[str, dict[str, float]] = {}
    for name, s in samples.items():
        result[name] = {k: round(statistics.median(v), 2) for k, v in s.items()}
        result[name].update({k.replace("_ms", "_min_ms"): round(min(v), 2) for k, v in s.items()})
    if "other" in result:
        result["ratio_this_over_other"] = {
            k: round(result["this"][k] / result["other"][k], 2) for k in result["this"]
            if result["other"][k]}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
