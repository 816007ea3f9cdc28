"""Sample workload `dataloader_bound`: slow Dataset.__getitem__ with num_workers=0.

Planted problem and fix: see the docstring of flight_profiler/workloads/dataloader_bound.py (expected top finding: dataloader-bottleneck).
Run: python examples/dataloader_bound.py [--steps N] [--device cpu|cuda]; it prints
`READY pid=<pid> step_fn=<module> [<Class>] <function>` when warm, then `step N avg_ms=X` about
once a second.
"""

from _common import run_workload

if __name__ == "__main__":
    run_workload("dataloader_bound")
