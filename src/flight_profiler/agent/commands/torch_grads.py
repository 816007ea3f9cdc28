"""``torch grads``: gradient and weight health of the models the target holds.

args: target (optional ``module [class] method``: measure right after each of its next
``calls`` calls, in the calling thread), calls, interval (seconds between measurements without
a method), timeout, label, path / default_dir.
Without a method, ``calls`` > 1 takes that many measurements ``interval`` apart, each at the
main thread's safe point (reading grads while the training thread runs an op is a data race).
While measuring more than once, optimizer steps and zero_grad calls are counted (optim_watch);
with a method, what each call saves for backward and whether a backward read it (graph_cost),
and the size of the graphs it returns or leaves on ``self`` (carried_graphs).
The document (``flight_profiler.grads`` v1, docs/commands-torch-grads.md) goes to a JSON file
and is the result; the report's grad-health rule reads it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import (
    call_window,
    carried_graphs,
    grad_stats,
    graph_cost,
    hooks,
    optim_watch,
    profile_window,
    targets,
)
from ..protocol import ERR_FAILED, ERR_USAGE
from ..registry import CommandError, Context
from ..safepoint import at_safe_point
from ..torch_support import check_writable, file_result, get_torch, output_path, write_json

FORMAT = "flight_profiler.grads"
VERSION = 1
# After the measured calls, how long to wait for a backward pass to end when none ended after the
# last one: a method called many times a step (a character RNN's forward, once per character of
# a 200-character chunk) has its calls in before the step's backward, and only that backward says
# whether its graphs were used and whether a link between two calls was state carried past a step
# or the step being built (a false critical graph-chain, issue 18). A program that built an
# optimizer waits this long; one without waits profile_window.NO_STEP_WAIT_S (a hand-written
# update steps after each backward; an inference loop has none to wait for).
BACKWARD_WAIT_S = 2.0
# In a program that trains, a call of the method under no_grad (an evaluation pass's forward)
# is not measured for this long: it changes no gradient, and measuring five of them read a
# fine-tuning loop's never-zeroed backbone gradients as a constant 1851, "explodes", instead of
# gradients growing step after step (the transfer-learning tutorial's val phase). Past it, such
# calls are measured (a loop that only evaluates now).
NO_GRAD_PATIENCE_S = 3.0


class _Run:
    """The models found at the first measurement, kept only for this request."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.models: list[tuple[Any, list[tuple[str, Any]]]] | None = None
        self.names: list[str] = []
        self.described: list[dict[str, Any]] = []
        self.optimizers: list[dict[str, Any]] = []
        self.scalers: list[Any] = []
        self.model_ids: list[set[int]] = []
        self.ddp: list[tuple[int, int, int | None]] = []
        self.measurements: list[dict[str, Any]] = []
        self.call_cost: graph_cost.CallGraphCost | None = None
        self.with_graph_cost = True
        self.active_thread: int | None = None
        self.carried: dict[str, Any] | None = None
        # each measured call's counter of saved tensors read back: a backward after the call
        # returns still reads through it (the hooks stay with the graph); counters only
        self.costs: list[graph_cost.CallGraphCost | None] = []
        self.backwards_at_last_call: int | None = None
        self.watch: optim_watch.OptimWatch | None = None

    def start(self, index: int) -> None:
        self.active_thread = threading.get_ident()
        self.carried = None
        if self.with_graph_cost:
            self.call_cost = graph_cost.CallGraphCost(self.torch)
            self.call_cost.enter()

    def stop(self, index: int) -> None:
        cost, self.call_cost = self.call_cost, None
        autograd = cost.exit() if cost is not None else None
        self.active_thread = None
        self.measure(index)
        self.measurements[-1]["autograd"] = autograd
        self.measurements[-1]["carried"] = self.carried
        self.costs.append(cost)
        if self.watch is not None:
            self.backwards_at_last_call = self.watch.backwards

    def wait_for_backward(self, ctx: Context, seconds: float) -> dict[str, Any]:
        """Wait up to ``seconds`` for a backward pass to end after the last measured call, when
        that call left a graph no backward had read yet (a step's own calls, whose backward ran
        inside them, and calls under no_grad have nothing to wait for); then say, per call, how
        many of its saved tensors were read back after it returned."""
        watch, last = self.watch, self.backwards_at_last_call
        if watch is None or last is None or not self.measurements:
            return {}
        autograd = self.measurements[-1].get("autograd") or {}
        pending = bool(autograd.get("grad_enabled") and autograd.get("saved_tensors") and not autograd.get("unpacked"))
        started = time.monotonic()
        while ((pending and watch.backwards == last) or _one_step_unzeroed(watch)) \
                and time.monotonic() - started < seconds:
            if ctx.wait(0.02):
                break
        came = watch.backwards > last
        for m, cost in zip(self.measurements, self.costs):
            autograd = m.get("autograd")
            if cost is not None and isinstance(autograd, dict):
                autograd["unpacked_after"] = max(0, cost.unpacked - int(autograd.get("unpacked") or 0))
        self.costs = []
        return {"backward_after_calls": came, "waited_for_backward_s": round(time.monotonic() - started, 3)}

    def watch_carried(self, ctx: Context, spec: dict[str, Any],
                      watch: optim_watch.OptimWatch | None = None) -> None:
        """Sizes of the graphs the recorded calls return or leave on ``self`` (carried_graphs).

        Installed before record_calls' own hook, so that on the way out it runs first and
        ``stop`` finds the sizes of the call it is closing."""
        target = targets.resolve(spec)
        carried = carried_graphs.CarriedGraphs(self.torch)

        def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
            if exc is None and threading.get_ident() == self.active_thread:
                self.carried = carried.after_call(token[0], target.bound_first, value,
                                                  carried_graphs.loop_frame_tensors(self.torch.Tensor),
                                                  watch.backwards if watch is not None else None)

        ctx.add_hook(f"torch grads: graphs carried by {target.description}", hooks.install(target, None, on_exit))

    def measure(self, call: int | None) -> None:
        torch = self.torch
        if self.models is None:
            self.models = grad_stats.find_models(torch)
            self.names = grad_stats.name_models(torch, self.models)
            self.described = grad_stats.describe(self.models, self.names)
            owner: dict[int, int] = {}
            for index, (module, params) in enumerate(self.models):
                owner.update((id(p), index) for _, p in params)
                self.model_ids.append({id(m) for m in module.modules()})
            held: set[int] = set()
            self.optimizers = optim_watch.find_optimizers(torch, owner, self.model_ids, held)
            if self.optimizers:
                _mark_unstepped(self.described, self.models, held)
            self.ddp = optim_watch.ddp_models(torch, [module for module, _ in self.models])
            self.scalers = optim_watch.find_grad_scalers(torch)
        self.measurements.append({
            "time": time.time(), "call": call,
            "models": [grad_stats.measure(torch, params) for _, params in self.models],
        })
        if self.scalers:
            self.measurements[-1]["grad_scales"] = optim_watch.grad_scales(self.scalers)

    def release(self) -> None:
        self.models = None
        self.costs = []
        self.scalers = []


def _training_calls(torch: Any, watch: optim_watch.OptimWatch) -> Callable[[], bool]:
    """Calls with grad on; a call with grad off once a backward has run since the method's
    previous call; any once NO_GRAD_PATIENCE_S has passed. An evaluation pass's calls run under
    no_grad with no backward between them. So does every optimizer's ``step`` (its decorator
    turns grad off before the hooked code runs), but a backward precedes each step: without
    that, an LBFGS or SGD step named waited out the whole patience (3 s of a diagnosis)."""
    until = time.monotonic() + NO_GRAD_PATIENCE_S
    with watch.lock:
        seen = [watch.backwards]

    def accept() -> bool:
        with watch.lock:
            backwards = watch.backwards
        ran, seen[0] = backwards != seen[0], backwards
        return bool(torch.is_grad_enabled()) or ran or time.monotonic() > until

    return accept


def _mark_unstepped(described: list[dict[str, Any]], models: list[tuple[Any, list[tuple[str, Any]]]],
                    held: set[int]) -> None:
    """On each model some optimizer steps, the layers (indexes into its ``layers``) whose
    parameters require grad but no optimizer holds: the fine-tuning tutorial's backbone left
    unfrozen while the optimizer gets only ``fc.parameters()``. Every backward computes their
    gradients, which nothing uses and the optimizer's zero_grad does not clear."""
    for doc, (_, params) in zip(described, models):
        shown = params[:grad_stats.MAX_LAYERS]
        if not any(id(p) in held for _, p in shown):
            continue  # no optimizer steps this model: the whole-model case (grad-health)
        doc["unstepped_layers"] = [i for i, (_, p) in enumerate(shown) if id(p) not in held]


def _one_step_unzeroed(watch: optim_watch.OptimWatch) -> bool:
    """One backward pass (or one optimizer step) and no zero_grad call seen yet: whether the
    loop zeroes its gradients takes two. Calls of a method run many times a step (a character
    RNN's forward, once per letter) are all in before its one backward; without the second,
    a loop that never zeroes read as unobserved and its NaN loss got the NaN's fix instead of
    zero_grad's (issue 18). A zeroing loop calls zero_grad between the two and ends the wait
    there; the wait costs at most one more step, within the backward wait's bound."""
    with watch.lock:
        if watch.zero_grads or watch.module_zero_grads:
            return False
        steps = sum(watch.steps.values())
        return watch.backwards == 1 or steps == 1


def handle_grads(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    calls = int(ctx.arg("calls", 1) or 1)
    interval = float(ctx.arg("interval", 1.0) or 1.0)
    timeout = float(ctx.arg("timeout", 60.0) or 60.0)
    spec = ctx.arg("target")
    if calls < 1 or interval <= 0:
        raise CommandError(f"bad arguments: calls={calls}, interval={interval}", "calls >= 1, interval > 0", ERR_USAGE)
    path = output_path(ctx.args, "grads", "json")
    check_writable(path)
    run = _Run(torch)
    watch: optim_watch.OptimWatch | None = None
    if spec or calls > 1:
        watch = optim_watch.OptimWatch()
        watch.install(ctx, torch)
    info: dict[str, Any] = {}
    after: dict[str, Any] = {}
    try:
        if spec:
            run.with_graph_cost = not graph_cost.suspends(spec)
            run.watch = watch
            run.watch_carried(ctx, spec, watch)
            started = time.monotonic()
            trains = profile_window.builds_optimizers(torch)
            # In the target's own thread, right after the call: no race with its ops.
            accept = _training_calls(torch, watch) if trains and watch is not None else None
            info = call_window.record_calls(ctx, spec, calls, timeout, run.start, run.stop, what="grads",
                                            accept=accept)
            if not info.get("cancelled"):
                wait = BACKWARD_WAIT_S if trains else profile_window.NO_STEP_WAIT_S
                left = timeout - (time.monotonic() - started)
                after = run.wait_for_backward(ctx, max(0.0, min(wait, left)))
        else:
            for i in range(calls):
                if i and ctx.wait(interval):
                    info["cancelled"] = True
                    break
                at_safe_point(ctx, lambda: run.measure(None), "torch grads")
                ctx.emit({"event": "progress", "what": "grads",
                          "message": f"measured {i + 1} of {calls}"})
    finally:
        ctx.remove_hooks()  # stop counting before the summary is read
        run.release()
    if not run.described:
        raise CommandError("no model with trainable parameters found in the target",
                           "torch grads looks for nn.Module objects with requires_grad parameters", ERR_FAILED)
    doc = {
        "format": FORMAT, "version": VERSION, "pid": os.getpid(), "time": time.time(),
        "label": str(ctx.arg("label", "") or ""),
        "mode": "method" if spec else "snapshot", "target": info.get("target"),
        "models": run.described, "measurements": run.measurements,
        "optimizers": run.optimizers,
        "zeroing": {**optim_watch.watch_summary(watch, run.optimizers, run.model_ids, run.ddp), **after},
    }
    size = write_json(path, doc)
    return {**file_result(path, size), **doc,
            **{k: info[k] for k in ("timed_out", "cancelled", "calls_recorded") if k in info}}
