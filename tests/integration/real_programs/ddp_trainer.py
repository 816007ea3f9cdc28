"""A classifier trained with DistributedDataParallel, in the style of the PyTorch DDP tutorial and
pytorch/examples' distributed scripts: the process group from torchrun's environment, a
DistributedSampler with `set_epoch`, DDP around the model, a train() function that holds the loop
in its locals, a validation pass on rank 0 after every epoch, the loss averaged across ranks with
an all_reduce for the log. Synthetic data, sized for a CPU; gloo.

    python -m torch.distributed.run --standalone --nproc_per_node 2 ddp_trainer.py \
        [--seconds S] [--mistake]

--mistake plants the classic error: rank 0's validation pass was written without
`torch.no_grad()` (and on the DDP wrapper), so every validation batch builds an autograd graph
that no backward ever uses, and the other rank waits for rank 0 in the next epoch's all_reduce.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SyntheticDataset(Dataset):
    def __init__(self, n, in_features=64, num_classes=10, seed=0):
        w = torch.randn(in_features, num_classes, generator=torch.Generator().manual_seed(42))
        self.x = torch.randn(n, in_features, generator=torch.Generator().manual_seed(seed))
        self.y = (self.x @ w).argmax(1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, in_features=64, hidden=256, num_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        x = self.dropout(F.relu(self.fc1(x)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def evaluate(model, loader, mistake):
    """Accuracy on the validation set, and the seconds spent waiting for its batches."""
    model.eval()
    correct = total = 0
    data_time = 0.0
    end = time.time()
    if mistake:
        # the mistake: no torch.no_grad(), so autograd records every batch for nothing
        for x, y in loader:
            data_time += time.time() - end
            out = model(x)
            correct += (out.argmax(1) == y).sum().item()
            total += len(y)
            end = time.time()
    else:
        with torch.no_grad():
            for x, y in loader:
                data_time += time.time() - end
                out = model(x)
                correct += (out.argmax(1) == y).sum().item()
                total += len(y)
                end = time.time()
    model.train()
    return correct / max(total, 1), data_time


def train(model, train_loader, val_loader, optimizer, rank, args, deadline):
    epoch = 0
    stop = False
    while not stop:
        train_loader.sampler.set_epoch(epoch)
        model.train()
        epoch_loss = 0.0
        data_time = 0.0  # waiting for batches, as pytorch/examples' imagenet meters it
        start = end = time.time()
        for batch_idx, (data, target) in enumerate(train_loader):
            data_time += time.time() - end
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
            if batch_idx % args.log_interval == 0 and rank == 0:
                print(f"Train Epoch: {epoch} [{batch_idx:3d}/{len(train_loader)}]\t"
                      f"Loss: {loss.item():.6f}", flush=True)
            end = time.time()
        # the epoch's mean loss over every rank, for the log, and whether any rank is out of time
        stats = torch.tensor([epoch_loss / len(train_loader), float(time.time() > deadline)])
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        stop = stats[1].item() > 0
        if rank == 0:
            acc, val_data_time = evaluate(model, val_loader, args.mistake)
            data_time += val_data_time
        if rank == 0:
            print(f"Epoch {epoch}: loss {stats[0].item() / dist.get_world_size():.4f} "
                  f"val acc {acc:.3f} (time {time.time() - start:.3f}s, data {data_time:.3f}s)",
                  flush=True)
        epoch += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--mistake", action="store_true")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")  # MASTER_ADDR, RANK, WORLD_SIZE from torchrun
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    torch.set_num_threads(1)

    train_set = SyntheticDataset(4096)
    val_set = SyntheticDataset(1024, seed=1)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=False,
                              sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=128)

    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train(model, train_loader, val_loader, optimizer, rank, args, time.time() + args.seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
