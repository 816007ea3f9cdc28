"""Every threshold the rules use, in one place, with where it comes from (docs/report-rules.md).

Rules read them from here (``T.name``), so a value is changed in one line and the docs table
names the same identifiers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    # Severity of every performance finding, from its cost (share of step / GPU time its fix
    # recovers). 5 %: torch-tb-profiler's bar for recommending a DataLoader fix; 20 %: a fix
    # worth a 1.25x speed-up, our line for "fix this first".
    cost_warning_pct: float = 5.0
    cost_critical_pct: float = 20.0
    # Borderline band around each line, a share of the line (5 % -> 4.25-5.75 %, 20 % -> 17-23 %)
    # or the measurement's own step-to-step spread when wider: inside it the lower severity is
    # given and the finding says "borderline" (report/cost.py judge). Measured here: one healthy
    # job's launch-overhead read 19.2 % and 20.1 % in two runs (issue 18); per-step DataLoader
    # shares of one run spread by 3-5 points on a loaded 2-core machine.
    severity_margin: float = 0.15
    # Gaps between GPU work shorter than this are launch latency (CPU-bound dispatch), longer
    # ones have another cause (sync, data loading, host code).
    launch_gap_us: float = 50.0
    # communication: exposed (not overlapped by compute) collective time, share of the GPU
    # span, from which it is reported at all (below: noise of a few small collectives).
    comm_exposed_min_pct: float = 1.0
    # dataloader-bottleneck: reported from 5 % of step time (torch-tb-profiler recommended more
    # workers above it), a warning from 10 %: healthy loaders with a few workers measure 5-10 %
    # (the held-out tutorial GAN 7.6 % timed with no tool attached; our AMP classifier 6-9 % by
    # its own meters on a loaded 2-core machine), and removing such a wait is worth < 1.1x.
    dataloader_min_pct: float = 5.0
    dataloader_warning_pct: float = 10.0
    # Unused since severity follows the cost (cost_*_pct); kept for a rule that sets its own.
    dataloader_critical_pct: float = 25.0
    # low-gpu-utilization: torch-tb-profiler flagged GPU kernel busy time below 50 %.
    gpu_busy_warning_pct: float = 50.0
    # Ignore windows too short to mean anything (one tiny step, warm-up only).
    min_gpu_window_us: float = 1_000.0
    # transfer-bottleneck: host<->device copies as a share of GPU busy time.
    transfer_warning_pct: float = 10.0
    # Pageable copies at all: pin_memory advice once they carry this much.
    pageable_min_bytes: int = 1 << 20
    # sync-bottleneck: blocking time as a share of the step/window time, from which the pattern
    # is reported (its severity then follows the GPU idle it causes).
    sync_warning_pct: float = 5.0
    # launch-overhead (GPU): median kernel shorter than this many us and many of them ...
    short_kernel_us: float = 10.0
    short_kernel_share_pct: float = 50.0
    min_kernels: int = 200
    # ... or the CPU spends more time launching than the GPU spends running (launch-bound).
    launch_to_kernel_ratio: float = 1.0
    # launch-overhead (CPU-only): tiny operators where dispatch dominates.
    tiny_op_us: float = 10.0
    tiny_op_share_pct: float = 50.0
    # ... and their self time is a large share of the window, or of all operator self time. The
    # second measure survives profiler overhead and CPU contention, which inflate the window.
    tiny_op_window_pct: float = 10.0
    tiny_op_self_share_pct: float = 40.0
    tiny_op_window_floor_pct: float = 5.0  # below this share of the window, never a finding
    min_ops: int = 500
    # hot-operators: rows in the table.
    hot_rows: int = 10
    # memory-leak from a trace: growth per step above this (and above noise) over >= N steps.
    leak_min_steps: int = 3
    leak_min_bytes_per_step: int = 1 << 20
    leak_min_r2: float = 0.6
    # memory-leak from snapshots / censuses: total growth and monotonic growth of holders.
    growth_min_bytes: int = 8 << 20
    growth_min_pct: float = 10.0
    # graph-retention from one census: a container holding this many grad_fn tensors.
    graph_holder_min_count: int = 50
    # graph-retention across censuses: growth below this many grad_fn tensors is a step in
    # flight (the loss of the current iteration), not retention.
    graph_growth_min_count: int = 10
    # fragmentation: reserved / allocated, and the absolute waste that makes it matter.
    frag_ratio: float = 1.5
    frag_min_waste_bytes: int = 512 << 20
    frag_critical_ratio: float = 3.0
    frag_inactive_split_blocks: int = 64
    # memory pressure: peak above this share of device memory (torch-tb-profiler used 90 %).
    peak_memory_pct: float = 90.0
    # grad-health: total grad norm (L2 of the parameters' L2 norms, as clip_grad_norm_ computes
    # it) above this, or growing this many times within one measurement window, is exploding.
    # Common clipping thresholds are max_norm 0.5-10; 1e3 is far past any of them.
    grad_norm_exploding: float = 1e3
    grad_norm_growth_ratio: float = 100.0
    # grad-health: grads that only grow over >= this many measurements, the last at least
    # grad_accumulation_ratio x the first, look accumulated (zero_grad not called).
    grad_accumulation_min_points: int = 3
    grad_accumulation_ratio: float = 1.5
    # graph-chain: one holder (<= this many tensors) whose graph memory grows across censuses.
    graph_chain_max_tensors: int = 4
    graph_chain_min_growth_bytes: int = 1 << 20
    # eval-with-grad: forward operators that recorded autograd nodes, none of backward.
    eval_grad_min_ops: int = 20


T = Thresholds()
