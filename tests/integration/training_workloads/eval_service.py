"""An inference service: the model lives in an object made in main(), requests are served in a
loop, and predict() runs the model with autograd on (no torch.no_grad()/inference_mode())."""
import os
import sys
import time

import torch


class Service:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                         torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
        self.model.eval()  # eval() alone does not turn autograd off

    def predict(self, batch):
        logits = self.model(batch)  # PLANTED: grad mode on, no backward ever
        return logits.argmax(dim=1).tolist()


def main():
    service = Service()
    stop = sys.argv[1]
    print("READY", flush=True)
    i = 0
    while not os.path.exists(stop):
        service.predict(torch.randn(64, 256))
        i += 1
        if i % 50 == 0:
            print(f"hb {i}", flush=True)
        time.sleep(0.005)
    print("DONE", flush=True)


main()
