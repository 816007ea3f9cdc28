"""A well-behaved training loop: NO finding of warning severity or above is expected.

Data lives on the device (generated there once), the step does forward, backward and an
optimizer step with ``zero_grad(set_to_none=True)``, the loss is accumulated on the device
(``detach()``) and read back with ``.item()`` only every ``LOG_EVERY`` steps, and evaluation
runs under ``torch.no_grad()``. Memory is flat from one step to the next.
Target: ``__main__ train_step`` (the module runs as the main script).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flight_profiler.workloads._common import (
    MLP,
    batch_size,
    parse_args,
    pick_device,
    run,
    synthetic_batch,
)

LOG_EVERY = 500
N_BATCHES = 8

_model: MLP | None = None
_optimizer: torch.optim.Optimizer | None = None
_batches: list[tuple[torch.Tensor, torch.Tensor]] = []
_step = 0
_running: torch.Tensor | None = None
last_logged_loss = 0.0


def train_step() -> None:
    global _step, _running, last_logged_loss
    assert _model is not None and _optimizer is not None
    x, y = _batches[_step % len(_batches)]
    loss = F.cross_entropy(_model(x), y)
    _optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    _optimizer.step()
    _running = loss.detach() if _running is None else _running + loss.detach()
    _step += 1
    if _step % LOG_EVERY == 0:
        last_logged_loss = (_running / LOG_EVERY).item()
        _running = None
        evaluate()


def evaluate() -> float:
    assert _model is not None
    with torch.no_grad():
        x, y = _batches[0]
        return float(F.cross_entropy(_model(x), y))


def main(argv: list[str] | None = None) -> None:
    global _model, _optimizer, _batches
    args = parse_args(__doc__ or "", argv)
    device = pick_device(args.device, args.threads)
    _model = MLP().to(device)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    _batches = [synthetic_batch(batch_size(device), device=device) for _ in range(N_BATCHES)]
    run(lambda: train_step(), f"{__name__} train_step", args, device)


if __name__ == "__main__":
    main()
