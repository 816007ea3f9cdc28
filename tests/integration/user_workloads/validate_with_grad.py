"""Training in a worker thread while the main thread waits in join(); every short epoch ends
with a validation pass written without torch.no_grad() (model.eval() alone does not turn
autograd off). Target: __main__ MLP forward (the method a user names)."""

import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def validate(model, batches):
    model.eval()
    correct = 0
    for x, y in batches:  # PLANTED: no torch.no_grad()
        correct += (model(x).argmax(1) == y).sum().item()
    model.train()
    return correct


def train(seconds):
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(60)]
    val_batches = [(torch.randn(128, 64), torch.randint(0, 10, (128,))) for _ in range(4)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for x, y in train_batches:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        validate(model, val_batches)


def main():
    torch.set_num_threads(1)
    worker = threading.Thread(target=train, args=(float(sys.argv[1]) if len(sys.argv) > 1 else 600,))
    worker.start()
    print("READY __main__ MLP forward", flush=True)
    worker.join()


if __name__ == "__main__":
    main()
