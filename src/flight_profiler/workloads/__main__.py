"""``python -m flight_profiler.workloads NAME [options]``: run one bundled sample workload.

The workload module runs as ``__main__`` (as a user's training script would), so its step is
targeted as ``__main__ train_step``; ``python -m flight_profiler.workloads.NAME`` does the same.
"""

from __future__ import annotations

import runpy
import sys

from flight_profiler.workloads import WORKLOADS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in WORKLOADS:
        names = ", ".join(WORKLOADS)
        sys.stderr.write(f"usage: python -m flight_profiler.workloads NAME [--steps N]; NAME: {names}\n")
        return 2
    name = argv[0]
    sys.argv = [f"flight_profiler.workloads.{name}", *argv[1:]]
    runpy.run_module(f"flight_profiler.workloads.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
