"""A torchrun job (gloo, CPU) with one planted problem: try `flight_profiler ps`, `--all-ranks`
and `diagnose --all-ranks` on it (docs/ranks.md). The --all-ranks tests and bench run it too.

    torchrun --nproc-per-node 4 examples/distributed_job.py MODE [READY_DIR]
    TORCH_FR_BUFFER_SIZE=2000 torchrun ...        # with Flight Recorder

MODE: healthy (batches from a DataLoader with one worker process per rank, which inherits the
rank's environment) | stuck (the odd rank sleeps outside the collective) | skip (the odd rank
skips an all_reduce and waits in a barrier) | straggler (the odd rank computes ~10x longer per step).
The odd rank is the last one. Each rank writes READY_DIR/rank<N> (its pid) once its loop runs,
and prints READY; the loop runs until the launcher is stopped (Ctrl-C). Model state lives in a function's locals, as users write it.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def slow_data_prep(x: torch.Tensor, repeat: int) -> torch.Tensor:
    for _ in range(repeat):
        x = torch.tanh(x @ x.T / x.shape[0])
    return x


def stuck_outside(seconds: float) -> None:
    time.sleep(seconds)  # the odd rank: never reaches the collective


def train_step(model: torch.nn.Linear, x: torch.Tensor, repeat: int) -> None:
    y = slow_data_prep(x, repeat)
    loss = model(y).sum()
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad = None


class Batches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        while True:
            yield torch.randn(64, 64)


def loader() -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    return torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=1)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    ready_dir = sys.argv[2] if len(sys.argv) > 2 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    odd = rank == world - 1
    torch.manual_seed(rank)
    model = torch.nn.Linear(64, 64)
    x = torch.randn(64, 64)
    # the odd rank computes ~10x longer: a straggler that stands out on a loaded 2-core machine
    repeat = 100 if (mode == "straggler" and odd) else 10
    batches = iter(loader()) if mode == "healthy" else None
    step = 0
    while True:
        if batches is not None:
            x = next(batches)
        train_step(model, x, repeat)
        step += 1
        if step == 3:
            if ready_dir:
                with open(os.path.join(ready_dir, f"rank{rank}"), "w") as fh:
                    fh.write(str(os.getpid()))
            print(f"READY rank={rank} pid={os.getpid()} mode={mode}", flush=True)
        if step >= 5 and mode == "stuck" and odd:
            stuck_outside(3600)
        if step >= 5 and mode == "skip":
            if not odd:
                dist.all_reduce(x)
            dist.barrier()
        time.sleep(0.005)


if __name__ == "__main__":
    main()
