"""Planted problem: a retained autograd graph (expected top finding: ``graph-retention``;
``memory-leak`` describes the same growth from the allocator's side).

Each step, ``Trainer.step`` trains on a batch and, every ``PROBE_EVERY`` steps, for its progress
log, computes the loss on a fixed probe batch WITHOUT ``torch.no_grad()`` and appends the loss
tensor itself::

    self.probe_losses.append(probe_loss)        # the bug
    self.probe_losses.append(probe_loss.item()) # the fix (and wrap the probe in torch.no_grad())

A loss tensor that requires grad keeps its ``grad_fn``, and the graph keeps every activation saved
for a backward pass that never comes. Measured here: each kept probe loss grew the process by
~635 KB (RSS; the census sees ~16 KB of it as graph tensors, the rest is held by C++), so about
300 KB a step on average (a probe every 2 steps), plus one more live tensor with a grad_fn held by a list. Target: ``__main__ Trainer step`` (a class method, so that
``module Class method`` targets are exercised).

Safety for a demo that runs forever: once the process has grown ``LEAK_CAP_MB`` (measured: RSS,
or CUDA allocated memory) the list is cleared (with a line on stdout), so the machine never runs
out of memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flight_profiler.workloads._common import (
    MLP,
    LeakGuard,
    batch_size,
    parse_args,
    pick_device,
    run,
    synthetic_batch,
)

LEAK_CAP_MB = 2048
PROBE_BATCH = 4
PROBE_EVERY = 2
HIDDEN = 1024


class Trainer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.model = MLP(hidden=HIDDEN).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.batch = synthetic_batch(batch_size(device), device=device)
        self.probe = synthetic_batch(PROBE_BATCH, device=device)
        self.probe_losses: list[torch.Tensor] = []
        self._guard = LeakGuard(device, LEAK_CAP_MB, every=5)
        self.steps = 0

    def step(self) -> float:
        x, y = self.batch
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.steps += 1
        if self.steps % PROBE_EVERY == 0:
            probe_loss = self.probe_loss()
            self.probe_losses.append(probe_loss)  # PLANTED: keeps the tensor and its graph
            self._guard.check(self.probe_losses.clear, "probe_losses")
        return 0.0

    def probe_loss(self) -> torch.Tensor:
        px, py = self.probe
        return F.cross_entropy(self.model(px), py)  # PLANTED: no torch.no_grad()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__ or "", argv)
    device = pick_device(args.device, args.threads)
    trainer = Trainer(device)
    run(lambda: trainer.step(), f"{__name__} Trainer step", args, device)


if __name__ == "__main__":
    main()
