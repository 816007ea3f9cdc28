"""Planted problem: a host-to-device copy and a device sync every step (expected top finding on
a GPU: ``sync-bottleneck``; on a CPU-only machine NO finding of warning or above, since there is
no device to transfer to or wait for).

Each step builds its batch on the host in ordinary (pageable) memory, copies it with a blocking
``.to(device)``, and then reads the loss back with ``loss.item()`` for a running average. On a
GPU the ``.item()`` makes the CPU wait until every queued kernel has finished
(``cudaStreamSynchronize`` / ``aten::_local_scalar_dense`` in the trace), so the CPU cannot queue
the next step's work ahead, and the pageable copy goes through a staging buffer
(``Memcpy HtoD (Pageable -> Device)``).

The fix: keep data on the device or load it with ``pin_memory=True`` and
``.to(device, non_blocking=True)``; accumulate the loss on the device (``running += loss.detach()``)
and call ``.item()`` every N steps only.
Target: ``__main__ train_step`` (the module runs as the main script).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flight_profiler.workloads._common import MLP, batch_size, parse_args, pick_device, run

_model: MLP | None = None
_optimizer: torch.optim.Optimizer | None = None
_device = torch.device("cpu")
_running_loss = 0.0
_batch = 256


def train_step() -> float:
    global _running_loss
    assert _model is not None and _optimizer is not None
    x_host = torch.randn(_batch, 256)  # pageable host memory
    y_host = torch.randint(0, 10, (_batch,))
    x, y = x_host.to(_device), y_host.to(_device)  # PLANTED: blocking pageable copy
    loss = F.cross_entropy(_model(x), y)
    _optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    _optimizer.step()
    _running_loss = 0.99 * _running_loss + 0.01 * loss.item()  # PLANTED: a sync every step
    return _running_loss


def main(argv: list[str] | None = None) -> None:
    global _model, _optimizer, _device, _batch
    args = parse_args(__doc__ or "", argv)
    _device = pick_device(args.device, args.threads)
    _batch = batch_size(_device)
    _model = MLP().to(_device)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    run(lambda: train_step(), f"{__name__} train_step", args, _device)


if __name__ == "__main__":
    main()
