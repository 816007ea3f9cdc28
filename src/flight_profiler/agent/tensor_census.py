"""A census of the target's live tensors: how many, how big, where, what autograd graphs they
retain, and who holds them (holder_paths). Produces the ``flight_profiler.census`` JSON
document (docs/commands-torch.md has the schema; the report's loader relies on it).

Bytes are counted per storage once: views share their base's storage, and the storage is
charged to its largest tensor. ``graph_bytes`` is what autograd graphs keep alive that no
live Python tensor already accounts for (saved tensors reached from ``grad_fn`` through
``next_functions``), within a node cap.

Costs are bounded: a deadline and an object budget for each phase; what was skipped is said.
The cyclic GC is paused during the census (its collections would walk every object again and
again while we allocate), and the big ``gc.get_objects()`` list is dropped as soon as the
tensors are picked out of it. Nothing outlives the call: the result is plain data.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
import warnings
import weakref
from typing import Any

from . import census_history, holder_paths
from .gc_walk import GcWalk
from .graph_limits import safe_graph_nodes

FORMAT = "flight_profiler.census"
VERSION = 1
MAX_GROUPS = 500
MAX_HOLDERS = 500


class Budget:
    def __init__(self, seconds: float, objects: int, walk_objects: int, graph_nodes: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.objects = objects
        self.walk_objects = walk_objects
        self.graph_nodes = graph_nodes


def _storage(torch: Any, t: Any) -> tuple[str, int, int] | None:
    """(device, storage key, storage bytes) of a dense tensor; None for sparse/meta/odd ones."""
    if t.layout != torch.strided or t.is_meta:
        return None
    # untyped_storage() since torch 2.0; storage() before (TypedStorage has nbytes() too)
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    ptr = st.data_ptr()
    nbytes = st.nbytes()
    # Storages of 0 bytes share ptr 0; key them apart so they are not merged.
    return str(t.device), (ptr if ptr else -id(st)), nbytes


def _scan(torch: Any, budget: Budget, skipped: list[str]) -> tuple[list[Any], int]:
    """Live tensors among gc-tracked objects (torch.Tensor objects are gc-tracked)."""
    walk = GcWalk(torch.Tensor, deadline=budget.deadline, limit=budget.objects)
    tensors = list(walk)
    if walk.unscanned > 0:
        skipped.append(f"{walk.unscanned} of {walk.total} gc objects not scanned "
                       "(time or object budget)")
    return tensors, walk.unscanned


# Reading a graph's saved tensor (``node._saved_self``) makes a Python tensor object that PyTorch
# then keeps alive with the graph: the next census would count thousands of "new" tensors that
# the census itself created. Weak references to them (never keeping anything alive) let later
# censuses leave them out.
_MADE_BY_GRAPH_WALK: dict[int, weakref.ref[Any]] = {}


def _made_by_us(t: Any) -> bool:
    ref = _MADE_BY_GRAPH_WALK.get(id(t))
    return ref is not None and ref() is t


def _forget_dead_refs() -> None:
    for key in [k for k, r in _MADE_BY_GRAPH_WALK.items() if r() is None]:
        del _MADE_BY_GRAPH_WALK[key]


class _Graphs:
    """Saved tensors reachable from grad_fn nodes, charged to the first root that reaches them."""

    def __init__(self, torch: Any, live: set[Any], budget: Budget) -> None:
        self.torch = torch
        self.live = live  # storage keys already counted as live Python tensors
        self.seen_storages: set[Any] = set()
        self.seen_nodes: dict[int, Any] = {}  # id -> node, kept only during the census
        self.saved_names: dict[type, tuple[str, ...]] = {}
        self.budget = budget
        self.truncated = False
        self.existing: set[int] = set()  # ids of the tensor objects that existed before the walk

    def _names(self, node: Any) -> tuple[str, ...]:
        t = type(node)
        names = self.saved_names.get(t)
        if names is None:
            names = tuple(a for a in dir(node) if a.startswith("_saved_"))
            self.saved_names[t] = names
        return names

    def bytes_from(self, root: Any) -> int:
        total = 0
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or id(node) in self.seen_nodes:
                continue
            if len(self.seen_nodes) >= self.budget.graph_nodes or time.monotonic() > self.budget.deadline:
                self.truncated = True
                return total
            self.seen_nodes[id(node)] = node
            for name in self._names(node):
                try:
                    value = getattr(node, name)
                except Exception:  # freed by backward(), or not a tensor slot
                    continue
                for t in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(t, self.torch.Tensor):
                        total += self._charge(t)
            with contextlib.suppress(Exception):
                stack.extend(fn for fn, _ in node.next_functions)
        return total

    def _charge(self, t: Any) -> int:
        if id(t) not in self.existing:
            with contextlib.suppress(TypeError):
                _MADE_BY_GRAPH_WALK[id(t)] = weakref.ref(t)
        try:
            info = _storage(self.torch, t)
        except Exception:
            return 0
        if info is None:
            return 0
        key = (info[0], info[1])
        if key in self.live or key in self.seen_storages:
            return 0
        self.seen_storages.add(key)
        return info[2]


def take(torch: Any, label: str = "", seconds: float = 5.0, max_objects: int = 20_000_000,
         walk_objects: int = 2_000_000, graph_nodes: int | None = None,
         max_depth: int = 12, previous_id: str | None = None,
         extra_roots: list[tuple[str, Any]] | None = None, moment: str = "") -> dict[str, Any]:
    """The census document. Runs while no thread can be inside a torch op (safepoint.py);
    pauses the cyclic GC meanwhile. ``previous_id``: the census_id of an earlier census of this
    process, to say per holder what it still holds and whether its graph is chained to the one
    it held then (census_history.py); ``extra_roots``: (label, value) walked as roots (a value
    a method just returned); ``moment``: when it was taken, said in the document."""
    started = time.monotonic()
    # Never more graph nodes than freeing them later can survive (graph_limits.py).
    budget = Budget(seconds, max_objects, walk_objects,
                    min(graph_nodes or safe_graph_nodes(), safe_graph_nodes()))
    skipped: list[str] = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        # Deprecated torch attributes warn when touched; the target's stderr is not ours.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tensors, unscanned = _scan(torch, budget, skipped)
            _forget_dead_refs()
            if _MADE_BY_GRAPH_WALK:
                before = len(tensors)
                tensors = [t for t in tensors if not _made_by_us(t)]
                if before - len(tensors):
                    skipped.append(f"{before - len(tensors)} tensor objects made by an earlier "
                                   "census's graph walk left out (their memory is in graph_bytes)")
            try:
                doc = _census(torch, tensors, unscanned, budget, skipped, label, started, max_depth,
                              previous_id, extra_roots)
                doc["moment"] = moment or "at a safe point"
                return doc
            finally:
                del tensors
    finally:
        if was_enabled:
            gc.enable()


def _census(torch: Any, tensors: list[Any], unscanned: int, budget: Budget, skipped: list[str],
            label: str, started: float, max_depth: int, previous_id: str | None,
            extra_roots: list[tuple[str, Any]] | None) -> dict[str, Any]:
    disable_subclass = getattr(torch._C, "DisableTorchFunctionSubclass", None)
    rows: list[tuple[str, str, tuple[int, ...], Any, int, bool, int]] = []
    owner: dict[Any, tuple[int, int]] = {}  # storage key -> (row index, tensor nbytes)
    odd = 0
    guard = disable_subclass() if disable_subclass is not None else _Null()
    with guard:
        for t in tensors:
            try:
                info = _storage(torch, t)
                has_fn = t.grad_fn is not None
                if info is None:
                    odd += 1
                    rows.append((str(t.device), _dtype(t), tuple(t.shape), None, 0, has_fn, id(t)))
                    continue
                device, key, nbytes = info
                rows.append((device, _dtype(t), tuple(t.shape), (device, key), nbytes, has_fn, id(t)))
                size = t.numel() * t.element_size()
                prev = owner.get((device, key))
                if prev is None or size > prev[1]:
                    owner[(device, key)] = (len(rows) - 1, size)
            except Exception:
                odd += 1
    if odd:
        skipped.append(f"{odd} sparse/meta/unreadable tensors counted without bytes")
    charged = {index for index, _ in owner.values()}
    del owner

    # Holders first: a saved tensor that something else also holds is not the graph's doing.
    wanted = {id(t): t for t in tensors}
    # The agent's threads are left out by name; the thread running this (the main thread at a
    # pending call) keeps its user frames, below the census's own.
    w = holder_paths.walk(torch, wanted, budget.walk_objects, max_depth, budget.deadline,
                          extra_roots=extra_roots)
    wanted.clear()
    holders_complete = not w.truncated
    if w.truncated:
        skipped.append(w.truncated)
    paths = {row[6]: w.path(row[6]) for row in rows}
    origins = {tid: w.origin(tid) for tid, where in paths.items() if where is not None}
    w.parent.clear()
    w.found.clear()
    reached = {row[3] for row in rows if row[3] is not None and paths[row[6]] is not None}

    # Retained autograd graphs: saved tensors no holder explains, charged to the first root
    # (reached roots first) whose graph reaches them; among those, the tensor made first (its
    # node's sequence number) first: a carried state (h_k-1) owns the history it shares with
    # what was computed from it (the output of step k), whichever local the walk found first.
    graphs = _Graphs(torch, reached, budget)
    graphs.existing = {id(t) for t in tensors}
    graph_of: dict[int, int] = {}
    for t in sorted(tensors, key=lambda t: (paths.get(id(t)) is None, _made_at(t))):
        fn = getattr(t, "grad_fn", None)
        if fn is not None:
            graph_of[id(t)] = graphs.bytes_from(fn)
        del fn
    graphs.seen_nodes.clear()
    graphs.existing.clear()
    in_graphs = graphs.seen_storages
    if graphs.truncated:
        skipped.append(f"autograd graph walk stopped at {budget.graph_nodes} nodes or the deadline")

    members = _Members()
    totals: dict[str, Any] = {"count": 0, "bytes": 0, "with_grad_fn": 0, "graph_bytes": 0, "by_device": {}}
    groups: dict[tuple[str, str, tuple[int, ...]], dict[str, Any]] = {}
    holders: dict[str, dict[str, Any]] = {}
    for index, (device, dtype, shape, key, nbytes, has_fn, tid) in enumerate(rows):
        b = nbytes if index in charged else 0
        g_bytes = graph_of.get(tid, 0)
        totals["count"] += 1
        totals["bytes"] += b
        totals["with_grad_fn"] += has_fn
        totals["graph_bytes"] += g_bytes
        dev = totals["by_device"].setdefault(device, {"count": 0, "bytes": 0})
        dev["count"] += 1
        dev["bytes"] += b
        group = groups.get((device, dtype, shape))
        if group is None:
            group = groups[(device, dtype, shape)] = {
                "device": device, "dtype": dtype, "shape": list(shape), "count": 0, "bytes": 0,
                "with_grad_fn": 0}
        group["count"] += 1
        group["bytes"] += b
        group["with_grad_fn"] += has_fn
        where = paths.get(tid)
        if where is None and key in in_graphs:
            continue  # a saved tensor of a graph: already in its root holder's graph_bytes
        example, canonical, kind = where if where is not None else ("<unreached>", "<unreached>", "unknown")
        holder = holders.get(canonical)
        if holder is None:
            holder = holders[canonical] = {
                "path": canonical, "example": example, "kind": kind, "count": 0, "bytes": 0,
                "with_grad_fn": 0, "graph_bytes": 0, "numel": 0}
            _root(holder, origins.get(tid))
        holder["count"] += 1
        holder["bytes"] += b
        holder["numel"] += math.prod(shape)
        holder["with_grad_fn"] += has_fn
        holder["graph_bytes"] += g_bytes
        members.note(canonical, tid, has_fn, origins.get(tid))
    paths.clear()
    origins.clear()
    members.finish(holders)
    census_id = os.urandom(6).hex()
    # The biggest holders, and those with graphs, are the ones a later census must compare.
    ranked = sorted(holders.values(), key=lambda h: (h["with_grad_fn"] == 0, -(h["bytes"] + h["graph_bytes"])))
    compared = members.history([h["path"] for h in ranked], tensors, census_id, previous_id,
                               budget.graph_nodes)
    for path, row in compared.items():
        if path in holders:
            holders[path].update(row)
    group_list = sorted(groups.values(), key=lambda g: (-g["bytes"], -g["count"]))
    holder_list = sorted(holders.values(), key=lambda h: (-(h["bytes"] + h["graph_bytes"]), -h["count"]))
    if len(group_list) > MAX_GROUPS:
        skipped.append(f"{len(group_list) - MAX_GROUPS} smallest groups left out")
    if len(holder_list) > MAX_HOLDERS:
        skipped.append(f"{len(holder_list) - MAX_HOLDERS} smallest holders left out")
    return {
        "format": FORMAT,
        "version": VERSION,
        "pid": os.getpid(),
        "time": time.time(),
        "label": label,
        "census_id": census_id,
        # False when the holder walk stopped at a budget: <unreached> then also holds tensors
        # that a longer walk would have named.
        "holders_complete": holders_complete,
        "previous_id": previous_id if census_history.known(previous_id) else None,
        "totals": totals,
        "groups": group_list[:MAX_GROUPS],
        "holders": holder_list[:MAX_HOLDERS],
        # Allocation sites are not recorded for live tensors; `torch memory -r` has them.
        "sites": [],
        "skipped": {"objects": unscanned, "reason": "; ".join(skipped)},
        "elapsed_s": round(time.monotonic() - started, 4),
        "walked_objects": w.visited,
    }


def _made_at(t: Any) -> int:
    """The sequence number of the node a tensor hangs from (creation order), else a big one."""
    fn = getattr(t, "grad_fn", None)
    if fn is None:
        return 1 << 65
    try:
        return int(fn._sequence_nr())
    except Exception:
        return 1 << 65
    finally:
        fn = None


def _root(holder: dict[str, Any], origin: tuple[str, int, Any] | None) -> None:
    """What a holder path starts from: a module global, a running function's local (and how
    deep that frame is in its thread: 0 = outermost), the value a method just returned."""
    if origin is None:
        holder["root"] = "unreached"
        return
    holder["root"] = origin[0]
    if origin[0] == "local":
        holder["depth"] = origin[1]


class _Members:
    """Per holder, while the rows are added up: a few tensor ids (the oldest found: gc lists
    the young generation first), the graph-carrying ones, and the capped containers."""

    def __init__(self) -> None:
        self.sample: dict[str, list[int]] = {}
        self.graph: dict[str, list[int]] = {}
        self.caps: dict[str, dict[int, tuple[int, int]]] = {}
        self.uncapped: set[str] = set()
        self.path_of: dict[int, str] = {}  # every tensor's holder, for what an earlier census saw

    def note(self, path: str, tid: int, has_fn: bool, origin: tuple[str, int, Any] | None) -> None:
        self.path_of[tid] = path
        sample = self.sample.setdefault(path, [])
        sample.append(tid)
        if len(sample) > census_history.SAMPLE:
            del sample[0]  # keep the last ones: the oldest objects
        if has_fn:
            graph = self.graph.setdefault(path, [])
            if len(graph) <= census_history.MAX_CHAINED:
                graph.append(tid)
        cap = origin[2] if origin is not None else None
        if cap is None:
            self.uncapped.add(path)
        else:
            self.caps.setdefault(path, {})[cap[0]] = (cap[1], cap[2])

    def finish(self, holders: dict[str, dict[str, Any]]) -> None:
        """A holder whose every tensor sits in a capped container gets its limit and length."""
        for path, caps in self.caps.items():
            if path not in self.uncapped and path in holders:
                holders[path]["cap"] = sum(limit for limit, _ in caps.values())
                holders[path]["length"] = sum(length for _, length in caps.values())
        self.caps.clear()

    def history(self, order: list[str], tensors: list[Any], census_id: str, previous_id: str | None,
                node_budget: int) -> dict[str, dict[str, Any]]:
        """Compare with the previous census (if this process took it) and remember this one,
        its holders in ``order`` (census_history keeps the first MAX_HOLDERS)."""
        graph = {p: ids for p, ids in self.graph.items() if len(ids) <= census_history.MAX_CHAINED}
        needed = {tid for ids in self.sample.values() for tid in ids}
        needed.update(tid for ids in graph.values() for tid in ids)
        by_id = {id(t): t for t in tensors if id(t) in needed}
        try:
            graph_tensors = {p: [by_id[i] for i in ids if i in by_id] for p, ids in graph.items()}
            compared: dict[str, dict[str, Any]] = {}
            if previous_id is not None and census_history.known(previous_id):
                compared = census_history.compare(previous_id, self.path_of, graph_tensors, node_budget)
            census_history.remember(census_id, {
                p: ([by_id[i] for i in self.sample[p] if i in by_id],
                    [fn for fn in (getattr(t, "grad_fn", None) for t in graph_tensors.get(p, [])) if fn is not None])
                for p in order[:census_history.MAX_HOLDERS] if p in self.sample})
            return compared
        finally:
            by_id.clear()
            self.sample.clear()
            self.graph.clear()
            self.path_of.clear()


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
