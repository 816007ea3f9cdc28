"""A regression loop that never calls optimizer.zero_grad(): the gradients add up step after
step, the updates grow, and the loss turns NaN within seconds. The loop keeps going (as such
loops do: nothing checks the loss). Batches come from a DataLoader with 2 worker processes,
forked anew every (short) epoch: also while the diagnosis has its hooks in."""
import os
import sys
import time

import torch


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()  # PLANTED: no self.opt.zero_grad()
        self.opt.step()
        return loss.item()


class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return 32 * 40

    def __getitem__(self, i):
        x = torch.randn(16)
        return x, x.sum().unsqueeze(0)


def main():
    trainer = Trainer()
    loader = torch.utils.data.DataLoader(Pairs(), batch_size=32, num_workers=2)
    stop = sys.argv[1]
    print("READY", flush=True)
    i = 0
    while not os.path.exists(stop):
        for x, y in loader:  # a new epoch: new worker processes
            loss = trainer.step(x, y)
            i += 1
            if i % 50 == 0:
                print(f"hb {i} loss {loss}", flush=True)
            time.sleep(0.005)
            if os.path.exists(stop):
                break
    print("DONE", flush=True)


main()
