"""A two-rank DDP trainer as the tutorial writes it, whose rank 1 stops in its data path.

    python -m torch.distributed.run --nproc-per-node 2 --standalone ddp_data_hang.py MODE READY_DIR

Once the file named by $HANG_GO exists, rank 1 fetches five more batches, then its data source
blocks for ever (a reader waiting on a dead shard server): rank 1 sits in ``next_batch()``
while rank 0 waits in the gradients' all-reduce inside ``loss.backward()``. The process group's
timeout is 10 minutes, so an armed hang trigger of a few seconds fires long before it.
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def next_batch(rank, step, stuck_after):
    if rank == 1 and stuck_after is not None and step >= stuck_after:
        threading.Event().wait()                       # DATA-HANG: the shard never answers
    return torch.randn(32, 64), torch.randn(32, 1)


def main():
    ready = sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    go = os.environ["HANG_GO"]
    stuck_after = None
    step = 0
    while True:
        if stuck_after is None and os.path.exists(go):
            stuck_after = step + 5
        x, y = next_batch(rank, step, stuck_after)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()                                # COLLECTIVE: DDP's all-reduce waits here
        opt.step()
        step += 1
        if step == 3:
            with open(os.path.join(ready, f"rank{rank}"), "w") as fh:
                fh.write(str(os.getpid()))
        time.sleep(0.02)


if __name__ == "__main__":
    main()
