"""Sample workload `transfer_sync`: pageable host->device copy and a .item() sync every step (a finding on GPU only).

Planted problem and fix: see the docstring of flight_profiler/workloads/transfer_sync.py (expected top finding: sync-bottleneck (on a GPU; on CPU no finding of warning or above)).
Run: python examples/transfer_sync.py [--steps N] [--device cpu|cuda]; it prints
`READY pid=<pid> step_fn=<module> [<Class>] <function>` when warm, then `step N avg_ms=X` about
once a second.
"""

from _common import run_workload

if __name__ == "__main__":
    run_workload("transfer_sync")
