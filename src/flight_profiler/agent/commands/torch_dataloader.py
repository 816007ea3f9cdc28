"""``torch dataloader``: the DataLoaders alive in the target, their settings, their workers, and
what the threads iterating them wait on (agent/dataloader_state.py does the work).

args: sample (seconds of stack sampling, 0 for none; default 1), sample_if_none (seconds to
sample instead when no DataLoader is alive: what is left to see is the loop's own calls, which
a diagnosis that knows their period needs less of). While sampling, every
DataLoader next() is timed too (``next_timing``: the DataLoader's share of each loop, without a
profiler's overhead). With ``target`` (a method, as the hooking commands take it), the graphs
its calls build during the window are followed too (agent/graph_use.py: ``graph_use``, which
calls built graphs that no backward read), so that an evaluation pass written without
``torch.no_grad()``, run once an epoch, is seen live.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

from .. import dataloader_state, grad_stats, graph_cost, graph_use, hooks, targets
from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..step_marks import BACKWARD_SPEC
from ..torch_support import get_torch

# The models whose forwards are followed when the named method is not a module's, and how long
# finding them may take (one pass over gc's objects, as ``torch grads`` makes).
MAX_MODELS = 4
MODEL_SEARCH_S = 1.0
# How long the backwards running when the window closes are waited for before the graphs'
# reads are judged (graph_use.GraphUse.settle): a step's backward, not a rank's all-reduce wait.
SETTLE_S = 2.0
_WRAPPED = ("module", "_orig_mod")


def handle_dataloader(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    try:
        sample = float(ctx.arg("sample", 1.0))
    except (TypeError, ValueError):
        sample = -1.0
    if not 0 <= sample <= 60:
        raise CommandError(f"bad --sample {ctx.arg('sample')!r}", "seconds between 0 and 60", ERR_USAGE)
    if_none = ctx.arg("sample_if_none")
    if if_none is not None:
        try:
            if_none = float(if_none)
        except (TypeError, ValueError):
            if_none = -1.0
        if not 0 < if_none <= 60:
            raise CommandError(f"bad --sample-if-none {ctx.arg('sample_if_none')!r}",
                               "seconds above 0, at most 60", ERR_USAGE)
    timer = _timer(ctx) if sample > 0 else None
    spec = ctx.arg("target")
    followed = _graph_use(ctx, torch, spec) if spec and sample > 0 else None
    use = followed[0] if followed else None
    if timer is not None and use is not None:
        timer.overhead = lambda: use.overhead_s
    try:
        result = dataloader_state.state(sample, cancelled=lambda: bool(ctx.cancelled), timer=timer,
                                        sample_if_none=if_none)
    finally:
        if use is not None:
            use.close()
            use.settle(SETTLE_S, cancelled=lambda: bool(ctx.cancelled))
        ctx.remove_hooks()
    if followed is not None:
        result["graph_use"] = followed[0].summary(followed[1])
    if not result["loaders"]:
        result["note"] = ("no DataLoader object is alive in the target (none created yet, or the "
                          "program feeds its batches another way)")
    return result


def _timer(ctx: Context) -> dataloader_state.NextTimer | None:
    """Time the DataLoaders' next() calls, and iter() where workers start, while sampling (None
    where torch has no DataLoader)."""
    try:
        target = targets.resolve(dataloader_state.NEXT_SPEC)
    except CommandError:
        return None
    timer = dataloader_state.NextTimer()
    ctx.add_hook("torch dataloader: timing next()", hooks.install(target, timer.on_enter, timer.on_exit))
    with contextlib.suppress(CommandError):  # a torch whose DataLoader has no __iter__ of its own
        starts = targets.resolve(dataloader_state.ITER_SPEC)
        ctx.add_hook("torch dataloader: timing iter()",
                     hooks.install(starts, timer.on_iter_enter, timer.on_iter_exit))
    with contextlib.suppress(CommandError):  # a torch without torch.autograd.backward in Python
        backward = targets.resolve(BACKWARD_SPEC)
        ctx.add_hook("torch dataloader: backward passes per loader",
                     hooks.install(backward, timer.on_backward_enter, _ignore))
    gc.callbacks.append(timer.on_gc)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(timer.on_gc)

    ctx.add_hook("torch dataloader: timing garbage collections", remove)
    return timer


def _ignore(token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
    pass


def _graph_use(ctx: Context, torch: Any, spec: dict[str, Any]) -> tuple[graph_use.GraphUse, str] | None:
    """Follow the graphs the model's forward passes build (None for a generator or coroutine,
    whose suspensions would not nest a thread-local hook pair)."""
    follow = [t for t in _followed(torch, spec) if not t.code.co_flags & graph_cost.SUSPENDS]
    if not follow:
        return None
    use = graph_use.GraphUse(torch)
    for target in follow:
        ctx.add_hook(f"torch dataloader: graphs built by {target.description}",
                     hooks.install(target, use.on_enter, use.on_exit))
    try:
        backward = targets.resolve(BACKWARD_SPEC)
    except CommandError:  # a torch without torch.autograd.backward as a Python function
        return use, ", ".join(t.description for t in follow)
    ctx.add_hook("torch dataloader: backward passes in flight",
                 hooks.install(backward, use.on_backward_enter, use.on_backward_exit))
    return use, ", ".join(t.description for t in follow)


def _followed(torch: Any, spec: dict[str, Any]) -> list[targets.Target]:
    """What builds the graphs to follow: the named method when it is a module's (a forward,
    or a submodule's); otherwise the forwards of the models the target holds. A step
    (``optimizer.step``, a user's ``train_step``) saves nothing for backward itself, and an
    evaluation pass runs outside it: whether a backward reads a graph is a question about the
    model's forward calls wherever the loop makes them (issue 18: "judge grad-mode use by
    whether a backward consumes the graph anywhere in the step, not inside the method")."""
    named = targets.resolve(spec)
    owner = targets.owner_class(spec)
    if owner is not None and issubclass(owner, torch.nn.Module):
        return [named]
    return _model_forwards(torch) or [named]


def _model_forwards(torch: Any) -> list[targets.Target]:
    """``forward`` of each root model's class (biggest first), and of the module a wrapper
    holds (DDP/DataParallel ``module``, torch.compile ``_orig_mod``): an evaluation written as
    ``model.module(x)`` calls the inner forward only. Calls nest, so a training call through
    the wrapper counts once (graph_use counts the outermost call)."""
    try:
        models = grad_stats.find_models(torch, seconds=MODEL_SEARCH_S)
    except Exception:
        return []
    found: list[targets.Target] = []
    codes: set[Any] = set()
    try:
        for root, _ in models[:MAX_MODELS]:
            inner = getattr(root, "_modules", None) or {}
            for module in (root, *(inner.get(k) for k in _WRAPPED if inner.get(k) is not None)):
                try:
                    target = targets.method_of(type(module), "forward")
                except (KeyError, CommandError):
                    continue
                if target.code not in codes:
                    codes.add(target.code)
                    found.append(target)
    finally:
        models.clear()
    return found
