"""In-process harness for the torch handlers: run a handler in its own thread, as the agent's
server does, while the test thread plays the target (calls the hooked method, holds tensors).

The workload lives in a real module registered in sys.modules (targets.resolve only looks at
imported modules), made fresh for each test and removed after it.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
import types
from typing import Any, Callable

from flight_profiler.agent import registry

WORKLOAD = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []          # the classic leak: losses.append(loss) keeps every step's loss alive
cache = {}           # cache[id] = output keeps every output's autograd graph alive

def train_step(i):
    x = torch.randn(32, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
    return float(loss.item())

def evaluate(i):
    out = model(torch.randn(128, 16))   # no torch.no_grad(): the graph stays with out
    cache[1000 + i] = out
    return out
"""


def make_workload(name: str = "fp_torch_workload") -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"/nonexistent/{name}.py"
    sys.modules[name] = module
    exec(compile(textwrap.dedent(WORKLOAD), module.__file__, "exec"), module.__dict__)
    return module


def drop_workload(module: types.ModuleType) -> None:
    sys.modules.pop(module.__name__, None)
    module.__dict__.clear()


def run_handler(cmd: str, args: dict[str, Any], drive: Callable[[], None] | None = None,
                timeout: float = 60.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``cmd`` in an agent-like thread; call ``drive()`` here until it ends."""
    events: list[dict[str, Any]] = []
    box: dict[str, Any] = {}
    ctx = registry.Context(args, emit=events.append)

    def run() -> None:
        try:
            box["result"] = registry.run(ctx, cmd)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="fp-test-agent", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        if drive is not None:
            drive()
        time.sleep(0.002)
        if time.monotonic() > deadline:
            ctx.cancel()
            thread.join(10)
            raise AssertionError(f"{cmd} did not finish in {timeout}s")
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"], events


def spec(module: str, method: str, cls: str | None = None) -> dict[str, Any]:
    return {"module": module, "class": cls, "method": method, "nested": None}
