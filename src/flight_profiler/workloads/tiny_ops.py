"""Planted problem: many tiny ops issued one by one from Python (expected top finding:
``launch-overhead``).

``train_step`` smooths a small (32 x 64) signal with a hand-written recurrence, one time step at
a time in a Python loop: 64 iterations of 4 elementwise ops on a 32-element column, i.e. about
260 operator calls of a few microseconds each, every one paying the full dispatch cost (and on a
GPU, one kernel launch each, far shorter than the launch itself). The useful arithmetic is a few
thousand floating-point operations.

The fix: vectorise over time (here: a cumulative sum with decay weights, or ``torch.cumsum`` /
a conv1d), or fuse the loop with ``torch.compile``; on GPU, CUDA graphs remove launch costs.
Target: ``__main__ train_step`` (the module runs as the main script).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flight_profiler.workloads._common import MLP, parse_args, pick_device, run, synthetic_batch

STEPS_IN_TIME = 64
DECAY = 0.9

_model: MLP | None = None
_optimizer: torch.optim.Optimizer | None = None
_batch: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0))


def smooth(signal: torch.Tensor) -> torch.Tensor:
    """Exponential smoothing along dim 1, one column at a time (the planted slow path)."""
    state = torch.zeros_like(signal[:, 0])
    columns = []
    for t in range(signal.shape[1]):  # PLANTED: a Python loop of tiny elementwise ops
        state = state * DECAY
        state = state + signal[:, t] * (1.0 - DECAY)
        columns.append(torch.tanh(state))
    return torch.stack(columns, dim=1)


def train_step() -> float:
    assert _model is not None and _optimizer is not None
    x, y = _batch
    with torch.no_grad():
        x = smooth(x)
    loss = F.cross_entropy(_model(x), y)
    _optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    _optimizer.step()
    return 0.0


def main(argv: list[str] | None = None) -> None:
    global _model, _optimizer, _batch
    args = parse_args(__doc__ or "", argv)
    device = pick_device(args.device, args.threads)
    _model = MLP(n_in=STEPS_IN_TIME).to(device)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    _batch = synthetic_batch(32, n_in=STEPS_IN_TIME, device=device)
    run(lambda: train_step(), f"{__name__} train_step", args, device)


if __name__ == "__main__":
    main()
