"""What every sample workload shares: device choice, a tiny model, and the run loop.

The run loop is the contract tests and `flight_profiler demo` rely on:

- it warms up (a few steps), then prints ``READY pid=<pid> step_fn=<module> [<Class>] <function>`` and
  flushes, so a launcher knows the process is ready to attach to and which method to target;
- it prints a heartbeat ``step N avg_ms=X.XXX`` about every ``--heartbeat`` seconds (default 1),
  where ``avg_ms`` is the mean step time since the previous heartbeat (the benchmark reads it);
- it runs forever, or ``--steps N`` steps, and exits 0 on SIGINT/SIGTERM.

The step is called through a fresh attribute lookup on every iteration (``step()`` is a small
closure that reads the module global or the instance attribute), so instrumentation that swaps a
function object in its module or class takes effect as well as instrumentation that patches code.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, Callable

import torch
from torch import nn


def pick_device(requested: str = "auto", threads: int = 1) -> torch.device:
    """The device to train on; on CPU also the number of intra-op threads.

    One thread by default: these models are tiny, and on a shared 2-core machine a second
    intra-op thread made a step 10-15x slower (contention), which would drown the planted problem.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    return device


class MLP(nn.Module):
    """Two linear layers, 256 -> 1024 -> 10 by default.

    Big enough that a CPU step (batch ``BATCH``) is spent in real arithmetic, a few ms on one core,
    not in per-operator dispatch: with 4x smaller layers the ~100 small operators of any training
    step (views, the loss, the optimizer's updates) took 17% of a healthy step, enough for the
    report to call it launch-bound, which is the planted problem of ``tiny_ops`` only.
    """

    def __init__(self, n_in: int = 256, hidden: int = 1024, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
        return out


# Examples per training batch on CPU; on a GPU the batch is scaled so that kernels are long
# enough not to be launch-bound (CUDA_BATCH_SCALE, not verified here: no GPU on this machine).
BATCH = 256
CUDA_BATCH_SCALE = 16


def batch_size(device: torch.device, base: int = BATCH) -> int:
    return base * CUDA_BATCH_SCALE if device.type == "cuda" else base


def synthetic_batch(
    batch: int, n_in: int = 256, n_out: int = 10, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, n_in, device=device)
    y = torch.randint(0, n_out, (batch,), device=device)
    return x, y


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="stop after N steps (0: forever)")
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    parser.add_argument("--heartbeat", type=float, default=1.0,
                        help="seconds between `step N avg_ms=X` lines")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU intra-op threads (0: leave torch's default)")
    parser.add_argument("--warmup", type=int, default=5, help="steps before READY is printed")
    return parser.parse_args(argv)


def memory_in_use(device: torch.device) -> int:
    """Bytes the leak lives in: CUDA allocated memory on a GPU, the process' RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class LeakGuard:
    """Safety for the leaking demos: once memory has grown ``cap_mb`` past where it started,
    the leak is cleared (with a line on stdout) so that a forgotten workload never exhausts the
    machine. Measured, not estimated: a retained autograd graph holds more than its tensors."""

    def __init__(self, device: torch.device, cap_mb: int, every: int = 50) -> None:
        self.device = device
        self.cap = cap_mb * 2**20
        self.every = every
        self.calls = 0
        self.start = memory_in_use(device)

    def check(self, clear: Callable[[], None], what: str) -> None:
        self.calls += 1
        if self.calls % self.every:
            return
        if memory_in_use(self.device) - self.start > self.cap:
            clear()
            print(f"leak cap of {self.cap >> 20} MB reached: cleared {what} (demo safety)",
                  flush=True)


class _Stop(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stop()


def run(
    step: Callable[[], Any],
    step_fn: str,
    args: argparse.Namespace,
    device: torch.device,
) -> None:
    """Call ``step()`` forever (or ``args.steps`` times) with READY and heartbeat lines.

    ``step_fn`` is what a user types to target the step: ``"<module> <function>"`` or
    ``"<module> <Class> <method>"``.
    """
    signal.signal(signal.SIGTERM, _on_sigterm)
    out = sys.stdout
    try:
        for _ in range(max(0, args.warmup)):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.write(f"device={device.type}\n")
        out.write(f"READY pid={os.getpid()} step_fn={step_fn}\n")
        out.flush()
        n = 0
        beat_start = time.perf_counter()
        beat_steps = 0
        while args.steps <= 0 or n < args.steps:
            step()
            n += 1
            beat_steps += 1
            now = time.perf_counter()
            if now - beat_start >= args.heartbeat:
                avg_ms = (now - beat_start) * 1000.0 / beat_steps
                out.write(f"step {n} avg_ms={avg_ms:.3f}\n")
                out.flush()
                beat_start, beat_steps = now, 0
        out.write(f"DONE steps={n}\n")
        out.flush()
    except (KeyboardInterrupt, _Stop, BrokenPipeError):
        pass
