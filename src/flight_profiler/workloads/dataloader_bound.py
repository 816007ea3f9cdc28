"""Planted problem: the input pipeline starves training (expected top finding:
``dataloader-bottleneck``).

``SlowDataset.__getitem__`` does per-sample work in Python that costs about 0.4 ms (simulated
decoding/augmentation: a sleep plus building the tensor), and the DataLoader runs it in the
training process (``num_workers=0``). The step fetches its batch itself (``next(_batches)``),
so a profile of ``train_step`` shows the time: about 7 ms of every ~8 ms step is spent in
``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` and below it in ``__getitem__``;
the model's own forward/backward takes well under a millisecond.

The fix: ``DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True)`` (more
workers than the step needs to keep up), and make ``__getitem__`` cheaper (decode once, cache).
Target: ``__main__ train_step`` (the module runs as the main script).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from flight_profiler.workloads._common import MLP, parse_args, pick_device, run

SAMPLE_SECONDS = 0.0004
BATCH = 16


class SlowDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, size: int = 4096) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(SAMPLE_SECONDS)  # PLANTED: stands for slow decoding/augmentation per sample
        generator = torch.Generator().manual_seed(index)
        return torch.randn(256, generator=generator), index % 10


def endless(loader: DataLoader[tuple[torch.Tensor, int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for _epoch in itertools.count():
        yield from loader


_model: MLP | None = None
_optimizer: torch.optim.Optimizer | None = None
_device = torch.device("cpu")


def train_step(batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
    assert _model is not None and _optimizer is not None
    x, y = next(batches)
    x, y = x.to(_device, non_blocking=True), y.to(_device, non_blocking=True)
    loss = F.cross_entropy(_model(x), y)
    _optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    _optimizer.step()
    return 0.0


def main(argv: list[str] | None = None) -> None:
    global _model, _optimizer, _device
    args = parse_args(__doc__ or "", argv)
    _device = pick_device(args.device, args.threads)
    _model = MLP().to(_device)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    # PLANTED: num_workers=0, so every sample is produced inside the training step.
    loader = DataLoader(SlowDataset(), batch_size=BATCH, shuffle=True, num_workers=0)
    batches = endless(loader)
    run(lambda: train_step(batches), f"{__name__} train_step", args, _device)


if __name__ == "__main__":
    main()
