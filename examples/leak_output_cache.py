"""Sample workload `leak_output_cache`: caches every step's output tensors in an ever-growing dict.

Planted problem and fix: see the docstring of flight_profiler/workloads/leak_output_cache.py (expected top finding: memory-leak).
Run: python examples/leak_output_cache.py [--steps N] [--device cpu|cuda]; it prints
`READY pid=<pid> step_fn=<module> [<Class>] <function>` when warm, then `step N avg_ms=X` about
once a second.
"""

from _common import run_workload

if __name__ == "__main__":
    run_workload("leak_output_cache")
