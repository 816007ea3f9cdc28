"""A DataLoader with num_workers=2 whose __getitem__ is too slow for the step: the loop waits
for batches most of the time. Target: __main__ train_step."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.02)  # PLANTED: decoding/augmentation per sample, 20 ms
        return torch.randn(3, 16, 16), i % 10


def train_step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def main():
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(768, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowImages(), batch_size=32, num_workers=2)
    print("READY __main__ train_step", flush=True)
    deadline = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 600)
    while time.monotonic() < deadline:
        for x, y in loader:
            train_step(model, opt, x, y)
            if time.monotonic() > deadline:
                break


if __name__ == "__main__":
    main()
