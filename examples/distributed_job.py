"""A torchrun job (gloo, CPU) with one planted problem: try `flight_profiler ps`, `--all-ranks`
and `diagnose --all-ranks` on it (docs/ranks.md). The --all-ranks tests and bench run it too.

    torchrun --nproc-per-node 4 examples/distributed_job.py MODE [READY_DIR]
    TORCH_FR_BUFFER_SIZE=2000 torchrun ...        # with Flight Recorder

MODE: healthy (batches from a DataLoader with one worker process per rank, which inherits the
rank's environment) | stuck (the odd rank sleeps outside the collective) | skip (the odd rank
skips an all_reduce and waits in a barrier) | straggler (the odd rank computes ~10x longer per step, 20 ms at least).
The odd rank is the last one. Each rank writes READY_DIR/rank<N> (its pid) once its loop runs,
and prints READY; the loop runs until the launcher is stopped (Ctrl-C). Model state lives in a function's locals, as users write it.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def slow_data_prep(x: torch.Tensor, repeat: int, at_least_s: float = 0.0) -> torch.Tensor:
    end = time.perf_counter() + at_least_s
    done = 0
    while done < repeat or time.perf_counter() < end:
        x = torch.tanh(x @ x.T / x.shape[0])
        done += 1
    return x


def stuck_outside(seconds: float) -> None:
    time.sleep(seconds)  # the odd rank: never reaches the collective


def train_step(model: torch.nn.Linear, x: torch.Tensor, repeat: int, at_least_s: float = 0.0) -> None:
    y = slow_data_prep(x, repeat, at_least_s)
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
    # the odd rank computes ~10x longer, and for 20 ms at least: a straggler that stands out
    # beside the loop's 5 ms sleep on a fast machine too (100 products took 4 ms on an idle one,
    # and the others' waits were then under the rule's 20 % of a step), not only a loaded one
    straggles = mode == "straggler" and odd
    repeat = 100 if straggles else 10
    at_least_s = 0.02 if straggles else 0.0
    batches = iter(loader()) if mode == "healthy" else None
    step = 0
    while True:
        if batches is not None:
            x = next(batches)
        train_step(model, x, repeat, at_least_s)
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
