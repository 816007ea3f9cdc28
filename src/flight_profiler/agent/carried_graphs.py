"""Graphs carried from one call to the next (``torch grads METHOD``): after each call, the size of
the autograd graph behind every tensor the call returned and every tensor attribute of its
``self`` (one level: tensors, and tensors in tuples/lists). A size that grows at every call is
state carried across calls without ``.detach()`` (an RNN/LSTM hidden state, a running sum of
losses): each call's graph hangs off the previous one.

This names the holder even where the census cannot (a local of the caller's loop: the value is
seen as the method returns it). Only counts are kept, never the tensors. The walk stops at
``MAX_NODES`` (reported as that number: "at least").
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

MAX_NODES = 50_000
MAX_NAMES = 16


def graph_nodes(fn: Any, limit: int = MAX_NODES) -> int:
    """Autograd nodes reachable from ``fn`` through next_functions (bounded)."""
    seen: set[int] = set()
    stack = [fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        with contextlib.suppress(Exception):
            stack.extend(n for n, _ in node.next_functions)
    return len(seen)


def _tensors(prefix: str, value: Any, tensor_type: type) -> list[tuple[str, Any]]:
    if isinstance(value, tensor_type):
        return [(prefix, value)]
    if isinstance(value, (tuple, list)):
        return [(f"{prefix}[{i}]", v) for i, v in enumerate(value[:8]) if isinstance(v, tensor_type)]
    return []


def sizes(torch: Any, args: tuple[Any, ...], bound_first: bool, value: Any) -> dict[str, int]:
    """{"return[0]": nodes, "self.state[1]": nodes, ...} for the tensors that carry a graph."""
    tensor_type = torch.Tensor
    found = _tensors("return", value, tensor_type)
    if bound_first and args:
        try:
            attrs: Mapping[str, Any] = object.__getattribute__(args[0], "__dict__")
        except Exception:
            attrs = {}
        for name, v in list(attrs.items()):
            if not name.startswith("__"):
                found += _tensors(f"self.{name}", v, tensor_type)
    out: dict[str, int] = {}
    for name, t in found[:MAX_NAMES]:
        fn = getattr(t, "grad_fn", None)
        if fn is not None:
            out[name] = graph_nodes(fn)
    return out
