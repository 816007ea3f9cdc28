"""A Trainer created inside main() that appends the loss tensor (not loss.item()) to
self.history: every step's graph stays alive. Target: __main__ Trainer step."""

import sys
import time

import torch


class Trainer:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.history = []

    def step(self, x, y):
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.history.append(loss)  # PLANTED: keeps the loss and its graph
        return loss


def main():
    torch.set_num_threads(1)
    trainer = Trainer()
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    print("READY __main__ Trainer step", flush=True)
    deadline = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 600)
    while time.monotonic() < deadline:
        trainer.step(x, y)
        time.sleep(0.002)


if __name__ == "__main__":
    main()
