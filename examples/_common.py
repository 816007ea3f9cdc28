"""Shared launcher: the examples are thin wrappers over flight_profiler.workloads.

The workload code lives in the installed package (so that `flight_profiler demo` finds it after a
plain `pip install`); from a source checkout without an install, src/ is put on sys.path.
The workload module runs as ``__main__``, like a user's own training script, so its step is
targeted as ``__main__ train_step`` (or ``__main__ Trainer step``).
"""

from __future__ import annotations

import os
import runpy
import sys


def run_workload(name: str) -> None:
    try:
        import flight_profiler.workloads  # noqa: F401
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, os.pardir, "src"))
    runpy.run_module(f"flight_profiler.workloads.{name}", run_name="__main__", alter_sys=True)
