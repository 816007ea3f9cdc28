"""Full-batch regression with LBFGS, written the way forum answers and blog posts on "how to use
torch.optim.LBFGS" write it: a small MLP fitting a noisy 1-D function, a `train()` function
holding the model, the data and the optimizer in its locals, `optimizer.step(closure)` once per
epoch with `line_search_fn="strong_wolfe"`, the loss the step returns logged every 10 epochs, and
a validation loss under `torch.no_grad()`.

    python lbfgs_regression.py [--seconds S] [--mistake]

--mistake plants the classic error: the loss `optimizer.step(closure)` returns (the closure's
first loss, a tensor with its graph) is kept for a plot (`history.append(loss)`), so every
epoch's graph stays alive.
"""

import argparse
import math
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
args = parser.parse_args()


class MLP(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(1, hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


def make_data(n=2000):
    x = torch.linspace(-3, 3, n).unsqueeze(1)
    y = torch.sin(2 * x) + 0.3 * torch.cos(5 * x) + 0.05 * torch.randn_like(x)
    return x, y


def train(seconds, mistake):
    torch.manual_seed(0)
    x, y = make_data()
    x_val, y_val = make_data(500)
    model = MLP()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20, history_size=10,
                                  line_search_fn="strong_wolfe")
    history = []
    start = time.time()
    epoch = 0
    while time.time() - start < seconds:
        def closure():
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        if mistake:
            history.append(loss)
        else:
            history.append(loss.item())

        with torch.no_grad():
            val = criterion(model(x_val), y_val).item()
        if epoch % 10 == 0:
            print(f"epoch {epoch:4d}  loss {loss.item():.6f}  val {val:.6f}  "
                  f"rmse {math.sqrt(val):.4f}", flush=True)
        epoch += 1
    return history


if __name__ == "__main__":
    torch.set_num_threads(1)
    train(args.seconds, args.mistake)
