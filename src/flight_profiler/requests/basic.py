"""Builders of the commands that hook nothing: `status`, `stack`, `detach`, `torch fr`,
`torch dataloader`."""

from __future__ import annotations

from collections.abc import Sequence

from flight_profiler.requests.base import AgentRequest, Line, target_args

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any


def status() -> AgentRequest:
    return AgentRequest("status", {}, "status")


def stack(show_all: bool = False, limit: int | None = None, progress: bool = False) -> AgentRequest:
    """Every thread's Python stack; ``limit`` frames per thread (default 200); ``progress``:
    each thread's kernel counters too (context switches, CPU ticks)."""
    args: dict[str, object] = {"all": show_all, "limit": 200 if limit is None else limit}
    if progress:
        args["progress"] = True
    return AgentRequest("stack", args, str(Line("stack").flag("--all", show_all).option("--limit", limit)
                                           .flag("--progress", progress)))


def detach() -> AgentRequest:
    return AgentRequest("detach", {}, "detach")


def fr() -> AgentRequest:
    return AgentRequest("torch fr", {}, "torch fr")


def dataloader(sample: float | None = None, target: Sequence[str] = (),
               sample_if_none: float | None = None) -> AgentRequest:
    """``sample`` seconds of stack sampling (default 1; 0: none), ``sample_if_none`` instead
    when no DataLoader is alive; with ``target``, whether a backward reads the graphs its calls
    build meanwhile."""
    args: dict[str, Any] = {"sample": 1.0 if sample is None else sample}
    if sample_if_none is not None:
        args["sample_if_none"] = sample_if_none
    if target:
        args["target"] = target_args(target)
    line = Line("torch dataloader", *target).option("--sample", sample)
    return AgentRequest("torch dataloader", args,
                        str(line.option("--sample-if-none", sample_if_none)))
