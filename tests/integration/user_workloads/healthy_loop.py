"""A healthy training loop as users write it: state in main()'s locals, loss read with .item(),
no growth. Target: __main__ train_step."""

import sys
import time

import torch


def train_step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def main():
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(128, 256), torch.randint(0, 10, (128,))) for _ in range(8)]
    history = []
    print("READY __main__ train_step", flush=True)
    deadline = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 600)
    i = 0
    while time.monotonic() < deadline:
        x, y = batches[i % len(batches)]
        history.append(train_step(model, opt, x, y))
        i += 1


if __name__ == "__main__":
    main()
