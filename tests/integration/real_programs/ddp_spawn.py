"""DistributedDataParallel started by `torch.multiprocessing.spawn`, written the way the PyTorch
tutorial "Getting Started with Distributed Data Parallel" writes it: `setup(rank, world_size)`
sets MASTER_ADDR/MASTER_PORT and calls `init_process_group("gloo", rank=rank, ...)` (no torchrun,
no RANK in the environment), a `ToyModel`, `demo_basic(rank, world_size)` holding the model, the
DDP wrapper and the optimizer in its locals, a DistributedSampler over a TensorDataset, and a
loss printed every `log_interval` batches, with the seconds spent waiting for the DataLoader and
those of all batches since the last line (the ImageNet example's Data/Time meters: the loader's
share measured with no tool attached). Sized for a CPU.

    python ddp_spawn.py [--seconds S] [--world_size N] [--mistake] [--mistake_kind bypass|set_epoch]

--mistake plants the classic error: the loop calls the wrapped module (`model(inputs)`, the
ToyModel) instead of the DDP wrapper (`ddp_model(inputs)`), so backward never all-reduces the
gradients and every rank trains its own copy: the replicas drift apart while the loss looks fine.
With --mistake_kind set_epoch it plants the other classic one instead: `sampler.set_epoch(epoch)`
left out, so every epoch shuffles the same way on every rank.
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(32, 256)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(256, 256)
        self.net3 = nn.Linear(256, 5)

    def forward(self, x):
        return self.net3(self.relu(self.net2(self.relu(self.net1(x)))))


def demo_basic(rank, world_size, args):
    print(f"Running basic DDP example on rank {rank}.", flush=True)
    setup(rank, world_size, args.port)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    # create model and move it to GPU with id rank (here: the CPU)
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(8192, 32, generator=g), torch.randn(8192, 5, generator=g))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    deadline = time.time() + args.seconds
    epoch = 0
    while True:
        if not (args.mistake and args.mistake_kind == "set_epoch"):
            sampler.set_epoch(epoch)
        running_loss = 0.0
        data_time = batch_time = 0.0  # since the last log line, as the ImageNet example's meters
        end = time.time()
        for i, (inputs, labels) in enumerate(loader):
            data_time += time.time() - end
            optimizer.zero_grad()
            if args.mistake and args.mistake_kind == "bypass":
                outputs = model(inputs)
            else:
                outputs = ddp_model(inputs)
            loss = loss_fn(outputs, labels)
            loss.backward()
            optimizer.step()

            running_loss += loss.item()
            batch_time += time.time() - end
            end = time.time()
            if i % args.log_interval == args.log_interval - 1:
                print(f"[rank {rank}] [{epoch + 1}, {i + 1:5d}] loss: "
                      f"{running_loss / args.log_interval:.3f}\tData {data_time:.3f}\tTime {batch_time:.3f}",
                      flush=True)
                running_loss = 0.0
                data_time = batch_time = 0.0
        epoch += 1
        # every rank stops at the same epoch: the first one out of time tells the others
        out_of_time = torch.tensor([float(time.time() > deadline)])
        dist.all_reduce(out_of_time)
        if out_of_time.item() > 0:
            break

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--log_interval", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--mistake", action="store_true")
    parser.add_argument("--mistake_kind", choices=("bypass", "set_epoch"), default="bypass")
    args = parser.parse_args()
    args.port = free_port()
    mp.spawn(demo_basic, args=(args.world_size, args), nprocs=args.world_size, join=True)
