"""Sample workload `leak_retained_graph`: keeps a loss tensor each step (not .item()), and with it the autograd graph.

Planted problem and fix: see the docstring of flight_profiler/workloads/leak_retained_graph.py (expected top finding: graph-retention).
Run: python examples/leak_retained_graph.py [--steps N] [--device cpu|cuda]; it prints
`READY pid=<pid> step_fn=<module> [<Class>] <function>` when warm, then `step N avg_ms=X` about
once a second.
"""

from _common import run_workload

if __name__ == "__main__":
    run_workload("leak_retained_graph")
