"""Sine-wave sequence prediction with LSTMCells and LBFGS, written the way pytorch/examples'
time_sequence_prediction is: the model's forward steps through time appending each output to a
list, the optimizer is LBFGS driven by a `closure`, and after every training step the model
predicts the future under `torch.no_grad()`.

    python time_sequence_prediction.py [--seconds S] [--mistake]

--mistake plants the classic error: the prediction after each step runs without
`torch.no_grad()`, so autograd records a graph for a forward pass nobody will backward through.
"""

import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


def make_data(T=20, L=40, N=20):
    x = np.empty((N, L), np.int64)
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    return np.sin(x / 1.0 / T).astype("float64")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--mistake", action="store_true")
    opt = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = make_data()
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    deadline = time.time() + opt.seconds
    for i in range(opt.steps):
        print("STEP: ", i, flush=True)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        # begin to predict, no need to track gradient here
        future = 20
        if opt.mistake:
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
        else:
            with torch.no_grad():
                pred = seq(test_input, future=future)
                loss = criterion(pred[:, :-future], test_target)
        print("test loss:", loss.item(), flush=True)
        y = pred.detach().numpy()
        if time.time() > deadline:
            break
