"""Sample workload `tiny_ops`: a Python loop of tiny elementwise ops each step.

Planted problem and fix: see the docstring of flight_profiler/workloads/tiny_ops.py (expected top finding: launch-overhead).
Run: python examples/tiny_ops.py [--steps N] [--device cpu|cuda]; it prints
`READY pid=<pid> step_fn=<module> [<Class>] <function>` when warm, then `step N avg_ms=X` about
once a second.
"""

from _common import run_workload

if __name__ == "__main__":
    run_workload("tiny_ops")
