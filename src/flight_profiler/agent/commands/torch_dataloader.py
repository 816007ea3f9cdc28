"""``torch dataloader``: the DataLoaders alive in the target, their settings, their workers, and
what the threads iterating them wait on (agent/dataloader_state.py does the work).

args: sample (seconds of stack sampling, 0 for none; default 1). While sampling, every
DataLoader next() is timed too (``next_timing``: the DataLoader's share of each loop, without a
profiler's overhead).
"""

from __future__ import annotations

from typing import Any

from .. import dataloader_state, hooks, targets
from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..torch_support import get_torch


def handle_dataloader(ctx: Context) -> dict[str, Any]:
    get_torch()
    try:
        sample = float(ctx.arg("sample", 1.0))
    except (TypeError, ValueError):
        sample = -1.0
    if not 0 <= sample <= 60:
        raise CommandError(f"bad --sample {ctx.arg('sample')!r}", "seconds between 0 and 60", ERR_USAGE)
    timer = _timer(ctx) if sample > 0 else None
    try:
        result = dataloader_state.state(sample, cancelled=lambda: bool(ctx.cancelled), timer=timer)
    finally:
        ctx.remove_hooks()
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
