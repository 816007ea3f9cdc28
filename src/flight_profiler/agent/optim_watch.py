"""Whether gradients are being zeroed between steps: counts of ``optimizer.step()`` and of
``zero_grad()`` calls (optimizer's and module's) while ``torch grads`` measures.

Installed only for the measurement window and removed with the request (ctx.add_hook): an idle
target pays nothing. ``step`` is counted through torch's global optimizer step hook (public API,
torch >= 2.0; subclasses override ``step`` itself), ``zero_grad`` by hooking the base classes'
methods (subclasses rarely override them). Counts are kept by object id; no object is kept.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

from . import hooks, targets
from .gc_walk import live_instances
from .registry import Context
from .step_marks import BACKWARD_SPEC

# DistributedDataParallel's forward: what all-reduces the gradients in the backward after it
# (it prepares the reducer). A loop that calls the module DDP wraps instead (`model(x)`,
# `ddp_model.module(x)`) trains each rank's copy alone. Hooked only where the program imported it.
DDP_FORWARD = {"module": "torch.nn.parallel.distributed", "class": "DistributedDataParallel",
               "method": "forward"}

_ZERO_GRAD = (
    ("optimizer", {"module": "torch.optim.optimizer", "class": "Optimizer", "method": "zero_grad"}),
    ("module", {"module": "torch.nn.modules.module", "class": "Module", "method": "zero_grad"}),
)


class OptimWatch:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: dict[int, int] = {}
        self.zero_grads: dict[int, int] = {}
        self.module_zero_grads: dict[int, int] = {}
        self.backwards = 0
        self.ddp_forwards: dict[int, int] = {}
        self.ddp_observed = False
        self.installed: list[str] = []
        self.errors: list[str] = []

    def install(self, ctx: Context, torch: Any) -> None:
        for kind, spec in _ZERO_GRAD:
            counts = self.zero_grads if kind == "optimizer" else self.module_zero_grads
            try:
                target = targets.resolve(spec)
                remove = hooks.install(target, None, self._counter(counts))
            except Exception as exc:  # an unusual torch build: say so, measure anyway
                self.errors.append(f"cannot observe {kind}.zero_grad: {exc}")
                continue
            ctx.add_hook(f"torch grads: counting {target.description} calls", remove)
            self.installed.append(target.description)
        # A hand-written update (`p.data.add_(p.grad, alpha=-lr)`: the PyTorch tutorials' first
        # RNNs) has no optimizer to count steps on: its backward passes are its steps.
        try:
            backward = targets.resolve(BACKWARD_SPEC)
            ctx.add_hook("torch grads: counting backward passes",
                         hooks.install(backward, None, self._on_backward))
            self.installed.append(backward.description)
        except Exception as exc:
            self.errors.append(f"cannot observe backward passes: {exc}")
        if DDP_FORWARD["module"] in sys.modules:
            try:
                ddp = targets.resolve(DDP_FORWARD)
                ctx.add_hook("torch grads: counting DistributedDataParallel forward calls",
                             hooks.install(ddp, None, self._counter(self.ddp_forwards)))
                self.installed.append(ddp.description)
                self.ddp_observed = True
            except Exception as exc:
                self.errors.append(f"cannot observe DistributedDataParallel.forward: {exc}")
        # torch.optim's namespace does not expose the submodule itself: read it where torch put it.
        register = getattr(sys.modules.get("torch.optim.optimizer"), "register_optimizer_step_post_hook", None)
        if register is None:
            self.errors.append("this torch has no global optimizer step hook: steps not counted")
            return
        handle = register(self._on_step)
        ctx.add_hook("torch grads: counting optimizer steps", handle.remove)
        self.installed.append("optimizer.step (global step hook)")

    def _counter(self, counts: dict[int, int]) -> Any:
        def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
            args: tuple[Any, ...] = token[0]
            if args:
                with self.lock:
                    counts[id(args[0])] = counts.get(id(args[0]), 0) + 1
        return on_exit

    def _on_backward(self, token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        with self.lock:
            self.backwards += 1

    def _on_step(self, optimizer: Any, args: Any, kwargs: Mapping[str, Any]) -> None:
        with self.lock:
            self.steps[id(optimizer)] = self.steps.get(id(optimizer), 0) + 1


def find_optimizers(torch: Any, param_owner: dict[int, int], module_ids: list[set[int]],
                    held: set[int] | None = None) -> list[dict[str, Any]]:
    """Optimizers alive in the target, each with the index of the model whose params it steps;
    ``held`` (when given) gets the ids of every parameter an optimizer holds."""
    opt_type = getattr(getattr(torch, "optim", None), "Optimizer", None)
    if opt_type is None:
        return []
    out = []
    for o in live_instances(opt_type):
        try:
            ids = [id(p) for group in o.param_groups for p in group["params"]]
            lr = o.param_groups[0].get("lr") if o.param_groups else None
        except Exception:
            continue
        if held is not None:
            held.update(ids)
        owners = [param_owner[i] for i in ids if i in param_owner]
        model = max(set(owners), key=owners.count) if owners else None
        out.append({"id": id(o), "class": f"{type(o).__module__}.{type(o).__qualname__}",
                    "params": len(ids), "model": model, "models": sorted(set(owners)),
                    "lr": float(lr) if isinstance(lr, (int, float)) else None})
    return out


def find_grad_scalers(torch: Any) -> list[Any]:
    """Enabled AMP GradScalers alive in the target: gradients read between backward() and the
    scaler's unscale_ are multiplied by its scale (65536 to start), so their norms say nothing
    about explosion without it."""
    types = tuple(t for t in (getattr(getattr(torch, "amp", None), "GradScaler", None),
                              getattr(getattr(getattr(torch, "cuda", None), "amp", None), "GradScaler", None))
                  if isinstance(t, type))
    if not types:
        return []
    out = []
    for o in live_instances(types):
        try:
            if o.is_enabled():
                out.append(o)
        except Exception:  # a half-built scaler
            continue
    return out


def grad_scales(scalers: list[Any]) -> list[float]:
    """Each scaler's current scale (a float; its scale tensor may not exist before the first step)."""
    out = []
    for s in scalers:
        try:
            out.append(float(s.get_scale()))
        except Exception:
            continue
    return out


def ddp_models(torch: Any, models: list[Any]) -> list[tuple[int, int, int | None]]:
    """(model index, id, world size or None) of the root models that are DistributedDataParallel
    wrappers (a torch.compile'd wrapper is not one: its root is the compiled module)."""
    ddp = getattr(sys.modules.get(DDP_FORWARD["module"]), "DistributedDataParallel", None)
    if not isinstance(ddp, type):
        return []
    out = []
    for index, module in enumerate(models):
        if not issubclass(type(module), ddp):
            continue
        try:
            world: int | None = int(module.process_group.size())
        except Exception:  # a process group already destroyed, or none
            world = None
        out.append((index, id(module), world))
    return out


def watch_summary(watch: OptimWatch | None, optimizers: list[dict[str, Any]],
                  model_ids: list[set[int]],
                  ddp: list[tuple[int, int, int | None]] | None = None) -> dict[str, Any]:
    """Counts per optimizer and per model (module.zero_grad on the root or any submodule), and
    the forward calls of each DistributedDataParallel model."""
    if watch is None:
        for o in optimizers:
            o.pop("id", None)
        return {"observed": False}
    with watch.lock:
        for o in optimizers:
            key = o.pop("id", None)
            o["steps"] = watch.steps.get(key, 0) if key is not None else 0
            o["zero_grad_calls"] = watch.zero_grads.get(key, 0) if key is not None else 0
        per_model = [sum(n for mid, n in watch.module_zero_grads.items() if mid in ids) for ids in model_ids]
        backwards = watch.backwards
        wrappers = [{"model": index, "forward_calls": watch.ddp_forwards.get(key, 0), "world_size": world}
                    for index, key, world in ddp or []] if watch.ddp_observed else []
    out = {"observed": True, "hooks": list(watch.installed), "errors": list(watch.errors),
           "module_zero_grad_calls": per_model, "backward_calls": backwards}
    if wrappers:
        out["ddp"] = wrappers
    return out
