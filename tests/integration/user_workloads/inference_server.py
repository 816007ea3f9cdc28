"""An inference server as users write it: the main thread waits in join() while a worker thread
serves requests, and caches each output in a module dict keyed per request. The outputs are
computed WITH autograd on (no torch.no_grad()): each keeps its graph alive. Target: __main__ handle."""

import sys
import threading
import time

import torch

_RESULT_CACHE = {}


def handle(model, request_id, x):
    out = model(x)  # PLANTED: no torch.inference_mode(): the graph stays with the output
    _RESULT_CACHE[request_id] = out
    return out.shape


def serve_forever(model, stop):
    n = 0
    while not stop.is_set():
        x = torch.randn(64, 256)
        handle(model, f"req-{n}", x)
        n += 1
        if n % 20 == 0:
            print(f"served {n}", flush=True)
        time.sleep(0.005)


def main():
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 64))
    stop = threading.Event()
    server = threading.Thread(target=serve_forever, args=(model, stop), name="server")
    server.start()
    print("READY __main__ handle", flush=True)
    server.join(float(sys.argv[1]) if len(sys.argv) > 1 else 600)  # the main thread is parked here
    stop.set()


if __name__ == "__main__":
    main()
