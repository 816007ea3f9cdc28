"""Cost of `torch grads` (and of what `torch anomaly` and eval-with-grad are about), CPU.

    .venv/bin/python bench/bench_grads.py [--layers 6] [--width 4096] [--json]

Measured in one run, each figure next to its reference from the same run (ratios survive a
loaded machine):
1. `torch grads` measurement on a ~100 M parameter model (6 x Linear(4096, 4096)): finding the
   models (gc pass + holder walk) and measuring every parameter (norms, max |grad|, weight
   norms, one host copy), against one plain pass over the grads (sum of p.grad.sum()).
2. Hooks per training step, on a small model whose step takes milliseconds (where a fixed cost
   shows most): a plain step; the same after the hooks were installed and removed (idle: must
   be identical, nothing is left behind); with the zero_grad/step counters installed (what
   `torch grads` keeps on while it measures); with a measurement after every step
   (`torch grads METHOD -n N`), small model and 100 M model; and with the saved-tensor hooks
   a measured call runs under (graph_cost.py).
3. `torch anomaly` per call: anomaly mode + the NaN watch against the plain call.
4. Evaluation with grad on vs `torch.inference_mode()`: time per call and the bytes the
   autograd graph holds (saved tensors, counted through saved_tensors_hooks).
5. The carried-graph check after a measured call, on a 60 000-op chain (and freeing it after).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402
import torch.utils._python_dispatch  # noqa: E402  (loaded by torch anyway; explicit for nan_watch)

from flight_profiler.agent import carried_graphs, grad_stats, graph_cost, nan_watch, optim_watch  # noqa: E402
from flight_profiler.agent.registry import Context  # noqa: E402


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def big_model(layers: int, width: int) -> dict[str, Any]:
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    numel = sum(p.numel() for p in model.parameters())
    model(torch.randn(4, width)).sum().backward()
    params = [(n, p) for n, p in model.named_parameters()]
    found = timed(lambda: grad_stats.name_models(torch, grad_stats.find_models(torch)), 3)
    measure = timed(lambda: grad_stats.measure(torch, params), 5)
    plain = timed(lambda: sum(float(p.grad.sum()) for _, p in params), 5)

    def step() -> None:
        model(torch.randn(4, width)).sum().backward()

    step_s = timed(step, 3)
    return {"parameters": numel, "find_and_name_s": round(found, 4), "measure_s": round(measure, 4),
            "one_plain_pass_s": round(plain, 4), "measure_over_plain_pass": round(measure / plain, 2),
            "train_step_s": round(step_s, 4), "measure_over_step": round(measure / step_s, 3)}


def small_loop() -> tuple[Callable[[], None], torch.nn.Module, torch.optim.Optimizer]:
    # A step of about a millisecond: a fixed per-step cost shows far more than on real models.
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def step() -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    return step, model, opt


def hook_costs(repeat: int) -> dict[str, Any]:
    """Paired rounds (plain, counting, idle-after-removal, measuring, in turn, many times): the
    machine's load changes between seconds, so each round's ratio is taken, then the median."""
    step, model, _ = small_loop()
    params = [(n, p) for n, p in model.named_parameters()]

    def block(measure: bool, saved: bool = False) -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            cost = graph_cost.CallGraphCost(torch) if saved else None
            if cost is not None:
                cost.enter()
            step()
            if cost is not None:
                cost.exit()
            if measure:
                grad_stats.measure(torch, params)
        return (time.perf_counter() - t0) / 20

    ratios: dict[str, list[float]] = {"idle": [], "counting": [], "measuring": [], "saved_hooks": []}
    plains = []
    installed: list[str] = []
    block(False)
    for _ in range(repeat * 4):
        plain = block(False)
        ctx = Context()
        watch = optim_watch.OptimWatch()
        watch.install(ctx, torch)
        installed = watch.installed
        counting = block(False)
        measuring = block(True)
        saved_hooks = block(False, saved=True)
        ctx.remove_hooks()
        idle = block(False)
        plains.append(plain)
        ratios["idle"].append(idle / plain)
        ratios["counting"].append(counting / plain)
        ratios["measuring"].append(measuring / plain)
        ratios["saved_hooks"].append(saved_hooks / plain)

    def pct(key: str) -> float:
        return round(100 * (statistics.median(ratios[key]) - 1), 1)

    return {"step_s": statistics.median(plains), "rounds": len(plains),
            "idle_after_removal_pct": pct("idle"), "counting_hooks_pct": pct("counting"),
            "measuring_every_step_pct": pct("measuring"), "saved_tensor_hooks_pct": pct("saved_hooks"),
            "hooks_installed": installed}


def anomaly_cost(repeat: int) -> dict[str, Any]:
    step, _, _ = small_loop()

    def under_anomaly() -> None:
        state = nan_watch.AnomalyState(torch)
        mode = nan_watch.make_watch(torch)
        mode.__enter__()
        torch.set_anomaly_enabled(True, False)
        try:
            step()
        finally:
            mode.__exit__(None, None, None)
            state.restore()

    plain = timed(step, repeat)
    anomalous = timed(under_anomaly, repeat)
    return {"call_s": round(plain, 5), "anomaly_call_s": round(anomalous, 5), "ratio": round(anomalous / plain, 1)}


def eval_cost(repeat: int, width: int) -> dict[str, Any]:
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)], torch.nn.ReLU())
    x = torch.randn(64, width)
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.untyped_storage().nbytes()
        return t

    def grad_on() -> None:
        model(x)

    def inference() -> None:
        with torch.inference_mode():
            model(x)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    on = timed(grad_on, repeat)
    off = timed(inference, repeat)
    return {"grad_on_s": round(on, 5), "inference_mode_s": round(off, 5), "time_ratio": round(on / off, 2),
            "graph_saved_bytes_per_call": saved[0], "output_bytes": 64 * width * 4}


def carried_walk_cost() -> dict[str, Any]:
    """The carried-graph check after a measured call, on state chained over 60 000 ops."""

    class Holder:
        h: torch.Tensor

    holder = Holder()
    x = torch.zeros(4, requires_grad=True)
    for _ in range(60_000):
        x = x * 1.0001 + 1.0
    holder.h = x
    del x
    probe = carried_graphs.CarriedGraphs(torch)
    probe.after_call((holder,), True, None)
    samples = []
    for _ in range(3):
        holder.h = holder.h * 1.0001
        t0 = time.perf_counter()
        result = probe.after_call((holder,), True, None)
        samples.append(time.perf_counter() - t0)
    holder.h = torch.zeros(1)  # freeing the chain must be safe after the check
    return {"chain_ops": 60_000, "check_s": round(statistics.median(samples), 6),
            "chained": result["self.h"]["chained"], "walked": result["self.h"]["walked"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: one thread gives steadier ratios
    out = {"hooks": hook_costs(a.repeat), "anomaly": anomaly_cost(a.repeat),
           "eval_with_grad": eval_cost(a.repeat, 1024), "carried_walk": carried_walk_cost()}
    gc.collect()
    out["grads_100M"] = big_model(a.layers, a.width)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    g, h, an, ev = out["grads_100M"], out["hooks"], out["anomaly"], out["eval_with_grad"]
    cw = out["carried_walk"]
    print(f"torch grads on {g['parameters'] / 1e6:.1f} M parameters: measure {g['measure_s']:.3f} s "
          f"({g['measure_over_plain_pass']}x one plain pass over the grads, {g['measure_over_step']}x a train step "
          f"of batch 4), find+name models {g['find_and_name_s']:.3f} s")
    print(f"hooks per step ({h['step_s'] * 1e3:.2f} ms step, median of {h['rounds']} paired rounds): idle after removal {h['idle_after_removal_pct']:+.1f}%, "
          f"counting zero_grad/step {h['counting_hooks_pct']:+.1f}%, measuring after every step "
          f"{h['measuring_every_step_pct']:+.1f}%, saved-tensor hooks of a measured call "
          f"{h['saved_tensor_hooks_pct']:+.1f}%")
    print(f"torch anomaly: {an['ratio']}x per call ({an['call_s'] * 1e3:.2f} -> {an['anomaly_call_s'] * 1e3:.2f} ms)")
    print(f"eval with grad on vs inference_mode: {ev['time_ratio']}x time, graph keeps "
          f"{ev['graph_saved_bytes_per_call'] / 2**20:.1f} MiB per call alive (output itself "
          f"{ev['output_bytes'] / 2**20:.2f} MiB)")
    print(f"carried-graph check on a {cw['chain_ops']}-op chain: {cw['check_s'] * 1e6:.0f} us per tensor per "
          f"measured call ({cw['walked']} nodes looked at, chained={cw['chained']}); freeing it afterwards: ok")


if __name__ == "__main__":
    main()
