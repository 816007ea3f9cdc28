"""``torch dataloader``: the DataLoaders alive in the target, their settings, their workers, and
what the threads iterating them wait on (agent/dataloader_state.py does the work).

args: sample (seconds of stack sampling, 0 for none; default 1). While sampling, every
DataLoader next() is timed too (``next_timing``: the DataLoader's share of each loop, without a
profiler's overhead). With ``target`` (a method, as the hooking commands take it), the graphs
its calls build during the window are followed too (agent/graph_use.py: ``graph_use``, which
calls built graphs that no backward read), so that an evaluation pass written without
``torch.no_grad()``, run once an epoch, is seen live.
"""

from __future__ import annotations

from typing import Any

from .. import dataloader_state, graph_cost, graph_use, hooks, targets
from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..torch_support import get_torch


def handle_dataloader(ctx: Context) -> dict[str, Any]:
    torch = get_torch()
    try:
        sample = float(ctx.arg("sample", 1.0))
    except (TypeError, ValueError):
        sample = -1.0
    if not 0 <= sample <= 60:
        raise CommandError(f"bad --sample {ctx.arg('sample')!r}", "seconds between 0 and 60", ERR_USAGE)
    timer = _timer(ctx) if sample > 0 else None
    spec = ctx.arg("target")
    use = _graph_use(ctx, torch, spec) if spec and sample > 0 else None
    try:
        result = dataloader_state.state(sample, cancelled=lambda: bool(ctx.cancelled), timer=timer)
    finally:
        if use is not None:
            use.close()
        ctx.remove_hooks()
    if use is not None:
        result["graph_use"] = use.summary(targets.resolve(spec).description)
    if not result["loaders"]:
        result["note"] = ("no DataLoader object is alive in the target (none created yet, or the "
                          "program feeds its batches another way)")
    return result


def _timer(ctx: Context) -> dataloader_state.NextTimer | None:
    """Time the DataLoaders' next() calls while sampling (None where torch has no DataLoader)."""
    try:
        target = targets.resolve(dataloader_state.NEXT_SPEC)
    except CommandError:
        return None
    timer = dataloader_state.NextTimer()
    ctx.add_hook("torch dataloader: timing next()", hooks.install(target, timer.on_enter, timer.on_exit))
    return timer


def _graph_use(ctx: Context, torch: Any, spec: dict[str, Any]) -> graph_use.GraphUse | None:
    """Follow the graphs the method's calls build (None for a generator or coroutine, whose
    suspensions would not nest a thread-local hook pair)."""
    if graph_cost.suspends(spec):
        return None
    target = targets.resolve(spec)
    use = graph_use.GraphUse(torch)
    ctx.add_hook(f"torch dataloader: graphs built by {target.description}",
                 hooks.install(target, use.on_enter, use.on_exit))
    return use
