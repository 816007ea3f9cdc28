"""Graphs carried from one call to the next (``torch grads METHOD``): after each call, for every
tensor the call returned and every tensor attribute of its ``self`` (one level: tensors, and
tensors in tuples/lists), whether its autograd graph reaches the root node the same name had
after the previous call. If it does at every call, each call's graph hangs off the previous
one: state carried without ``.detach()`` (an RNN/LSTM hidden state, a running sum of losses).
This names the holder even where the census cannot (a local of the caller's loop: the value is
seen as the method returns it).

Why not simply count the graph's nodes: touching a node from Python gives it a Python wrapper
that lives as long as the node, and freeing a long chain of wrapped nodes recurses once per
node: measured here, a chain of ~45 000 wrapped nodes crashed the process (SIGSEGV, 8 MB stack)
when the program later dropped it. So the walk looks only at the newest part of the graph
(``NODES_PER_CALL``) and the request has a total budget (``NODES_PER_REQUEST``, far below the
crash depth). Only ids, sequence numbers and counts are kept, never the nodes or tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from .graph_limits import safe_graph_nodes

NODES_PER_CALL = 2_000
NODES_PER_REQUEST = safe_graph_nodes()  # graph_limits.py: more can crash the target later
MAX_NAMES = 16


def _tensors(prefix: str, value: Any, tensor_type: type) -> list[tuple[str, Any]]:
    if isinstance(value, tensor_type):
        return [(prefix, value)]
    if isinstance(value, (tuple, list)):
        return [(f"{prefix}[{i}]", v) for i, v in enumerate(value[:8]) if isinstance(v, tensor_type)]
    return []


def _key(node: Any) -> tuple[int, int]:
    try:
        return id(node), int(node._sequence_nr())
    except Exception:
        return id(node), -1


def _reaches(root: Any, wanted: tuple[int, int], limit: int) -> tuple[bool, int]:
    """(whether ``wanted`` is among the first ``limit`` nodes from ``root``, nodes walked)."""
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        node = stack.pop(0)  # breadth first: the previous call's root is near the top
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) == wanted[0] and _key(node) == wanted:
            return True, len(seen)
        with contextlib.suppress(Exception):
            stack.extend(n for n, _ in node.next_functions)
    return False, len(seen)


class CarriedGraphs:
    """Per request: the previous call's roots by name, and the walk budget left."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.previous: dict[str, tuple[int, int]] = {}
        self.budget = NODES_PER_REQUEST

    def after_call(self, args: tuple[Any, ...], bound_first: bool, value: Any) -> dict[str, Any]:
        """{name: {"chained": bool | None, "walked": n}} for the tensors that carry a graph."""
        tensor_type = self.torch.Tensor
        found = _tensors("return", value, tensor_type)
        if bound_first and args:
            try:
                attrs: Mapping[str, Any] = object.__getattribute__(args[0], "__dict__")
            except Exception:
                attrs = {}
            for name, v in list(attrs.items()):
                if not name.startswith("__"):
                    found += _tensors(f"self.{name}", v, tensor_type)
        out: dict[str, Any] = {}
        current: dict[str, tuple[int, int]] = {}
        for name, t in found[:MAX_NAMES]:
            fn = getattr(t, "grad_fn", None)
            if fn is None:
                continue
            current[name] = _key(fn)
            chained: bool | None = None
            walked = 0
            before = self.previous.get(name)
            if before is not None and before != current[name] and self.budget > 0:
                chained, walked = _reaches(fn, before, min(NODES_PER_CALL, self.budget))
                self.budget -= walked
            out[name] = {"chained": chained, "walked": walked}
            del fn
        self.previous = current
        return out
