"""Sample PyTorch workloads, each with one planted and documented problem (and a healthy one).

They are shipped inside the package so that ``flight_profiler demo`` finds them after a plain
``pip install``; ``examples/*.py`` in the repository are thin launchers for the same code.
Each module's docstring says what is planted and which report rule should fire.
Run one with ``python -m flight_profiler.workloads NAME [--steps N]``.
"""

from __future__ import annotations

# name -> (rule id that should be the top finding, or None for the healthy one; one-line summary)
WORKLOADS: dict[str, tuple[str | None, str]] = {
    "leak_retained_graph": (
        "graph-retention",
        "keeps a loss tensor each step (not .item()), and with it the autograd graph",
    ),
    "leak_output_cache": ("memory-leak", "caches every step's output tensors in an ever-growing dict"),
    "dataloader_bound": ("dataloader-bottleneck", "slow Dataset.__getitem__ with num_workers=0"),
    "tiny_ops": ("launch-overhead", "a Python loop of tiny elementwise ops each step"),
    "transfer_sync": (
        "sync-bottleneck",
        "pageable host->device copy and a .item() sync every step (a finding on GPU only)",
    ),
    "healthy": (None, "a well-behaved training loop: no finding of warning or above"),
}

DEFAULT_DEMO = "leak_retained_graph"
