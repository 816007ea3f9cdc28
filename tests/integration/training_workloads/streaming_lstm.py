"""A streaming LSTM that carries its state from chunk to chunk without detaching it: each
chunk's graph hangs off the previous one, so memory grows for as long as the stream runs."""
import os
import sys
import time

import torch


class Stream:
    def __init__(self):
        self.lstm = torch.nn.LSTM(64, 128)
        self.state = None

    def chunk(self, x):
        out, self.state = self.lstm(x, self.state)  # PLANTED: self.state is never detached
        return out.mean().item()


def main():
    stream = Stream()
    stop = sys.argv[1]
    print("READY", flush=True)
    i = 0
    while not os.path.exists(stop):
        stream.chunk(torch.randn(16, 8, 64))
        i += 1
        if i % 20 == 0:
            print(f"hb {i}", flush=True)
        time.sleep(0.01)
    print("DONE", flush=True)


main()
