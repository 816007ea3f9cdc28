"""Graphs carried from one call to the next (``torch grads METHOD``): after each call, for every
tensor the call returned (nested tuples, lists and dicts included: an LSTM's ``output, (h, c)``),
every tensor attribute of its ``self``, and every tensor local of the loop's frame (the first of
the program's own functions above the method: where ``hidden`` or ``running_loss`` lives),
whether its autograd graph reaches the root node the same name had after the previous call. If
it does at every call, each call's graph hangs off the previous one: state carried without
``.detach()`` (an RNN/LSTM hidden state, a running sum of losses). This names the holder even
where the census cannot, whatever the method is (the model's forward, the step).

Why not simply count the graph's nodes: touching a node from Python gives it a Python wrapper
that lives as long as the node, and freeing a long chain of wrapped nodes recurses once per
node: measured here, a chain of ~45 000 wrapped nodes crashed the process (SIGSEGV, 8 MB stack)
when the program later dropped it. So the walk looks only at the newest part of the graph
(``NODES_PER_CALL``, oldest node first: :func:`reaches`) and the request has a total budget
(``NODES_PER_REQUEST``, far below the crash depth). Only ids, sequence numbers and counts are
kept, never the nodes or tensors.
"""

from __future__ import annotations

import contextlib
import heapq
import sys
import threading
from collections.abc import Mapping
from typing import Any

from .graph_limits import safe_graph_nodes

NODES_PER_CALL = 2_000
NODES_PER_REQUEST = safe_graph_nodes()  # graph_limits.py: more can crash the target later
MAX_NAMES = 32
_CO_OPTIMIZED = 0x0001
_UNKNOWN_SEQ = 1 << 65  # after every real sequence number (AccumulateGrad's is 2**64 - 1)


def _tensors(prefix: str, value: Any, tensor_type: type, depth: int = 3) -> list[tuple[str, Any]]:
    """(name, tensor) for a tensor and the tensors nested in tuples, lists and dicts.

    By type(), not isinstance(): that reads ``__class__``, which runs code on proxy objects."""
    t = type(value)
    if issubclass(t, tensor_type):
        return [(prefix, value)]
    if depth <= 0:
        return []
    out: list[tuple[str, Any]] = []
    if issubclass(t, (tuple, list)):
        for i, v in enumerate(value[:8]):
            out += _tensors(f"{prefix}[{i}]", v, tensor_type, depth - 1)
    elif issubclass(t, dict):
        for k, v in list(value.items())[:8]:
            if isinstance(k, str):
                out += _tensors(f"{prefix}[{k[:40]!r}]", v, tensor_type, depth - 1)
    return out


def loop_frame_tensors(tensor_type: type) -> list[tuple[str, Any]]:
    """The tensors (and tuples of tensors) bound to names in the frame of the first of the
    program's own functions above the running hook: the caller's loop, where carried state
    lives (``train() local hidden``). Read as holder_paths reads locals: a snapshot dict emptied
    afterwards; a traced frame or one calling locals()/vars() is not read (before 3.13)."""
    from . import holder_paths  # lazy: only torch grads with a method needs it

    libs = holder_paths.library_prefixes()
    f: Any = sys._getframe(1)
    try:
        while f is not None:
            code = f.f_code
            module = str(f.f_globals.get("__name__", "?"))
            ours = code.co_filename.startswith("<flight_profiler") or module.startswith(holder_paths.OURS)
            if not ours and not code.co_filename.startswith(libs):
                break
            f = f.f_back
        if f is None:
            return []
        code = f.f_code
        thread = threading.current_thread().name
        if not code.co_flags & _CO_OPTIMIZED:  # module-level code: its locals are the globals
            prefix = f"{f.f_globals.get('__name__', '?')}."
            values = dict(f.f_globals)
        else:
            prefix = holder_paths.frame_prefix(thread, str(f.f_globals.get("__name__", "?")), code.co_name) + " "
            if sys.version_info < (3, 13) and (f.f_trace is not None or "locals" in code.co_names
                                               or "vars" in code.co_names):
                return []
            snap = f.f_locals
            values = dict(snap)
            if sys.version_info < (3, 13):
                snap.clear()
            snap = None
    finally:
        f = None
    out: list[tuple[str, Any]] = []
    try:
        for name, v in values.items():
            if not name.startswith("__") and issubclass(type(v), (tensor_type, tuple)):
                out += _tensors(f"{prefix}{name}", v, tensor_type, 2)
    finally:
        values.clear()
    return out


_MAX_REAL_SEQ = 1 << 63  # AccumulateGrad's number is 2**64 - 1: not a creation order


def node_key(node: Any) -> tuple[Any, int]:
    """A node's identity that outlives its Python wrapper: (class name, sequence number).

    Not id(node): a C++ node's Python wrapper can be freed between two looks and its address
    given to another node's wrapper (seen on CUDA, torch 2.11: the cuDNN LSTM step k's node got
    the wrapper address of step k-1's, which then had a new one), so an id named the wrong node
    and a carried chain read as "not chained". Sequence numbers count a thread's autograd nodes;
    with the class name two live nodes rarely share one. Nodes without a real number
    (AccumulateGrad, unreadable) fall back to the id."""
    try:
        seq = int(node._sequence_nr())
    except Exception:
        return id(node), -1
    if 0 <= seq < _MAX_REAL_SEQ:
        return type(node).__name__, seq
    return id(node), seq


def reaches(starts: list[Any], wanted: set[tuple[Any, int]], limit: int) -> tuple[bool | None, int]:
    """Whether a node of ``wanted`` (node_key) is reachable from ``starts``, and how many nodes
    were looked at; None when ``limit`` stopped the search first.

    Best first, oldest node first: autograd numbers nodes in creation order (per thread) and an
    edge always leads to an older node, so a node older than every wanted one cannot lead to
    them (pruned), and following the oldest open node walks down a carried chain (h_k -> h_k-1)
    before the side branches each step hangs off it (a micro-batch's whole graph): a chain of
    hundreds of steps costs a few nodes per step instead of every node of every step.
    """
    floor = min((key[1] for key in wanted if key[1] >= 0), default=-1)
    heap: list[tuple[int, int, Any]] = []
    seen: set[tuple[Any, int]] = set()
    tick = 0

    def push(node: Any) -> None:
        nonlocal tick
        seq = node_key(node)[1]
        if floor >= 0 and 0 <= seq < floor:
            return
        tick += 1
        heapq.heappush(heap, (seq if seq >= 0 else _UNKNOWN_SEQ, tick, node))

    try:
        for node in starts:
            if node is not None:
                push(node)
        while heap:
            if len(seen) >= limit:
                return None, len(seen)
            node = heapq.heappop(heap)[2]
            key = node_key(node)
            if key in seen:
                continue
            seen.add(key)
            if key in wanted:
                return True, len(seen)
            with contextlib.suppress(Exception):
                for child, _ in node.next_functions:
                    if child is not None and node_key(child) not in seen:
                        push(child)
        return False, len(seen)
    finally:
        heap.clear()
        node = None


class CarriedGraphs:
    """Per request: the previous call's roots by name, and the walk budget left."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.previous: dict[str, tuple[Any, int]] = {}
        self.budget = NODES_PER_REQUEST
        self.backwards_before: int | None = None

    def after_call(self, args: tuple[Any, ...], bound_first: bool, value: Any,
                   caller: list[tuple[str, Any]] | None = None,
                   backwards: int | None = None) -> dict[str, Any]:
        """{name: {"chained": bool | None, "walked": n, "scalar": bool[, "from": name]}} for the
        tensors that carry a graph; ``caller``: the loop frame's tensors (loop_frame_tensors),
        read in the calling thread right after the call. ``from`` names what the previous call
        returned (or kept on self) when a caller's local now holds it: the same state.

        ``backwards``: backward passes completed so far (None: not counted). A graph that
        reaches the previous call's with no backward in between is a step still being built,
        not state carried across steps: a character RNN feeds a name one character per forward
        call and backpropagates once per name, through the whole chain, as it must. Such a link
        is marked ``"same_step": True``: where the loop trains (backwards come), only a chain that
        outlived a backward is carried state; where none ever comes (a stateful inference loop
        without ``.detach()``), the chain grows for ever and every link counts (the report)."""
        same_step = backwards is not None and backwards == self.backwards_before
        self.backwards_before = backwards
        tensor_type = self.torch.Tensor
        found = _tensors("return", value, tensor_type)
        if bound_first and args:
            try:
                attrs: Mapping[str, Any] = object.__getattribute__(args[0], "__dict__")
            except Exception:
                attrs = {}
            for name, v in list(attrs.items()):
                if not name.startswith("__"):
                    found += _tensors(f"self.{name}", v, tensor_type, 2)
        found += caller or []
        out: dict[str, Any] = {}
        current: dict[str, tuple[Any, int]] = {}
        was = {key: name for name, key in self.previous.items()}
        for name, t in found[:MAX_NAMES]:
            fn = getattr(t, "grad_fn", None)
            if fn is None:
                continue
            current[name] = node_key(fn)
            chained: bool | None = None
            walked = 0
            before = self.previous.get(name)
            if before is not None and before != current[name] and self.budget > 0:
                chained, walked = reaches([fn], {before}, min(NODES_PER_CALL, self.budget))
                self.budget -= walked
            try:
                scalar = t.numel() == 1
            except Exception:
                scalar = False
            out[name] = {"chained": chained, "walked": walked, "scalar": scalar}
            if same_step and before is not None:
                out[name]["same_step"] = True
            source = was.get(current[name])
            if source is not None and source != name:
                out[name]["from"] = source
            del fn
        self.previous = current
        return out
