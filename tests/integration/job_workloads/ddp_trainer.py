"""A DDP trainer the way the tutorials write one: DistributedDataParallel around a small model,
a map-style Dataset split by DistributedSampler, a DataLoader with two worker processes, a
background thread that prefetches batches into a queue, SGD. Run under torchrun (gloo, CPU):

    python -m torch.distributed.run --nproc-per-node 2 --standalone ddp_trainer.py MODE [READY_DIR]

MODE plants one problem on the last rank (the "odd" one); the others are healthy:
  healthy       nothing planted
  slow_data     its samples take 40x longer to load (a slow disk on that node)
  slow_compute  it computes an extra, expensive metric on every batch
  sleep         it sleeps in its logging call on every step (a slow metrics store)
  hang          its prefetch thread dies on a bad sample: it waits for a batch forever (after
                6 batches; with FP_HANG_FILE=PATH in the environment: once PATH exists)
  skip          it skips the barrier the others enter before saving a checkpoint

FP_ODD_RANK=N in the environment plants it on rank N instead of the last.
Each rank writes READY_DIR/rank<N> (its pid) after its third step, and prints READY.
TORCH_FR_BUFFER_SIZE in the environment turns on Flight Recorder, as for any torch job.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Samples(Dataset):  # type: ignore[type-arg]
    def __init__(self, size: int, load_seconds: float) -> None:
        self.size = size
        self.load_seconds = load_seconds

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.load_seconds)  # reading and decoding the sample
        g = torch.Generator().manual_seed(i)
        return torch.randn(128, generator=g), i % 10


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def expensive_metric(outputs: torch.Tensor) -> float:
    """The odd rank's extra work in slow_compute: a similarity matrix of its features."""
    feats = outputs.detach().repeat(32, 32)  # 256 x 320
    sim = feats @ feats.T
    for _ in range(6):
        sim = torch.tanh(sim @ sim / sim.shape[0])
    return float(sim.mean())


def log_metrics(step: int, loss: float, slow: bool) -> None:
    if slow:
        time.sleep(0.04)  # a metrics store 40 ms away


class Prefetcher:
    """Batches from the DataLoader, fetched by a background thread into a small queue."""

    def __init__(self, loader: DataLoader, fail_after: int | None) -> None:  # type: ignore[type-arg]
        self.loader = loader
        self.fail_after = fail_after
        self.batches: queue.Queue[tuple[torch.Tensor, torch.Tensor]] = queue.Queue(maxsize=2)
        threading.Thread(target=self._fill, name="prefetch", daemon=True).start()

    def _fill(self) -> None:
        n = 0
        epoch = 0
        while True:
            self.loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for batch in self.loader:
                n += 1
                if self.fail_after is not None and self._fails(n):
                    raise ValueError("corrupt sample")  # the thread dies, nobody notices
                self.batches.put(batch)
            epoch += 1

    def _fails(self, n: int) -> bool:
        bad_file = os.environ.get("FP_HANG_FILE")
        return os.path.exists(bad_file) if bad_file else n > (self.fail_after or 0)

    def wait_for_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches.get()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    opt.zero_grad()
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()  # DDP all-reduces the gradients in here
    opt.step()
    return loss, out


def save_checkpoint(model: nn.Module, step: int) -> None:
    pass  # rank 0 would write model.state_dict() here


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    ready_dir = sys.argv[2] if len(sys.argv) > 2 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # The odd rank: the last, or FP_ODD_RANK (a straggler on node 0 of a 2-node job).
    odd = rank == int(os.environ.get("FP_ODD_RANK", world - 1))
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples(1_000_000, 0.02 if (mode == "slow_data" and odd) else 0.0005)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data), num_workers=2,
                        persistent_workers=True)
    prefetch = Prefetcher(loader, 6 if (mode == "hang" and odd) else None)
    step = 0
    while True:
        x, y = prefetch.wait_for_batch()
        loss, out = train_step(model, opt, x, y)
        if mode == "slow_compute" and odd:
            expensive_metric(out)
        log_metrics(step, loss.item(), slow=mode == "sleep" and odd)
        step += 1
        if step % 5 == 0 and step >= 5 and not (mode == "skip" and odd):
            dist.barrier()  # everyone done with the step before the checkpoint
            save_checkpoint(model, step)
        if step == 3:
            if ready_dir:
                with open(os.path.join(ready_dir, f"rank{rank}"), "w") as fh:
                    fh.write(str(os.getpid()))
            print(f"READY rank={rank} pid={os.getpid()} mode={mode}", flush=True)


if __name__ == "__main__":
    main()
