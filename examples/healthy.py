"""Sample workload `healthy`: a well-behaved training loop: no finding of warning or above.

Planted problem and fix: see the docstring of flight_profiler/workloads/healthy.py (expected: no finding of warning or above).
Run: python examples/healthy.py [--steps N] [--device cpu|cuda]; it prints
`READY pid=<pid> step_fn=<module> [<Class>] <function>` when warm, then `step N avg_ms=X` about
once a second.
"""

from _common import run_workload

if __name__ == "__main__":
    run_workload("healthy")
