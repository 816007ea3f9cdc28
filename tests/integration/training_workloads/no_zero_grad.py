"""A regression loop that never calls optimizer.zero_grad(): the gradients add up step after
step, the updates grow, and the loss turns NaN within seconds. The loop keeps going (as such
loops do: nothing checks the loss)."""
import os
import sys
import time

import torch


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self):
        x = torch.randn(32, 16)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()  # PLANTED: no self.opt.zero_grad()
        self.opt.step()
        return loss.item()


def main():
    trainer = Trainer()
    stop = sys.argv[1]
    print("READY", flush=True)
    i = 0
    while not os.path.exists(stop):
        loss = trainer.step()
        i += 1
        if i % 50 == 0:
            print(f"hb {i} loss {loss}", flush=True)
        time.sleep(0.005)
    print("DONE", flush=True)


main()
