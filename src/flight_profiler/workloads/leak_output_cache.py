"""Planted problem: an ever-growing cache of output tensors (expected top finding: ``memory-leak``).

``train_step`` keeps a sample of each step's outputs (the first 256 rows of the logits, 64
classes) for a later plot, in a module-level dict keyed by the step number: a key that never
repeats, so nothing is ever evicted::

    _output_cache[_step] = logits[:SAMPLE].detach().clone()   # the bug: a new 256 KB tensor each step
    # the fix: bound the cache (functools.lru_cache / an OrderedDict with a max size), key it by
    # something that repeats, or do not keep device tensors at all

(``.clone()`` because a slice alone is a view that would keep the whole batch's logits alive.)

The tensors are detached (no autograd graph), so this is a plain leak, not graph retention:
live memory and the count of live tensors held by one dict grow linearly with steps.
Target: ``__main__ train_step`` (the module runs as the main script).

Safety for a demo that runs forever: once the process has grown ``LEAK_CAP_MB`` (measured: RSS,
or CUDA allocated memory) the dict is cleared (with a line on stdout).
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
SAMPLE = 256  # rows kept per step, whatever the batch size (the GPU batch is larger)
N_CLASSES = 256

_output_cache: dict[int, torch.Tensor] = {}
_step = 0
_model: MLP | None = None
_optimizer: torch.optim.Optimizer | None = None
_batch: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0))
_guard: LeakGuard | None = None


def setup(device: torch.device) -> None:
    global _model, _optimizer, _batch, _guard
    _model = MLP(n_out=N_CLASSES).to(device)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    _batch = synthetic_batch(batch_size(device), n_out=N_CLASSES, device=device)
    _guard = LeakGuard(device, LEAK_CAP_MB)


def train_step() -> float:
    global _step
    assert _model is not None and _optimizer is not None
    x, y = _batch
    logits = _model(x)
    loss = F.cross_entropy(logits, y)
    _optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    _optimizer.step()
    _step += 1
    _output_cache[_step] = logits[:SAMPLE].detach().clone()  # PLANTED: a cache whose key never repeats
    if _guard is not None:
        _guard.check(_output_cache.clear, "the cache")
    return 0.0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__ or "", argv)
    device = pick_device(args.device, args.threads)
    setup(device)
    run(lambda: train_step(), f"{__name__} train_step", args, device)


if __name__ == "__main__":
    main()
