"""What a census remembers for the next one in the same process: whether a holder still holds the
tensors it held before (``kept``), and whether the graph it holds now reaches the one it held
before (``chained``).

Growth alone does not tell a leak from a list that lives inside a running ``forward()`` (built
and dropped every call, caught at different lengths), nor a carried graph from a fresh one. So
each census keeps, per holder path, weak references to a few of its tensors (the oldest found:
a leaking list keeps its first entries) and the (id, sequence number) of the autograd nodes its
graph-carrying tensors hang from. The next census, given the previous one's ``census_id``, says
per holder how many of those tensors are still alive AND still held at the same path, and
whether the holder's graph now reaches the nodes it had (carried_graphs.reaches).

Nothing here keeps a tensor or a node alive: weak references and integers only, for the last
``KEEP_CENSUSES`` censuses, at most ``SAMPLE`` tensors and ``ROOTS`` nodes per holder. (With
torch 2.x, a tensor saved by an autograd graph keeps its Python object alive anyway; a weak
reference to it changes nothing.)
"""

from __future__ import annotations

import collections
import contextlib
import weakref
from typing import Any

from .carried_graphs import reaches

KEEP_CENSUSES = 3
SAMPLE = 8          # tensors per holder, as weak references
ROOTS = 4           # graph roots per holder (holders of at most MAX_CHAINED graph tensors)
MAX_CHAINED = 8     # a holder of more graph-carrying tensors is a container, not carried state
MAX_HOLDERS = 300
NODES_PER_HOLDER = 5_000

_Book = dict[str, tuple[list["weakref.ref[Any]"], list[tuple[int, int]]]]
_BOOKS: collections.OrderedDict[str, _Book] = collections.OrderedDict()


def node_key(node: Any) -> tuple[int, int]:
    try:
        return id(node), int(node._sequence_nr())
    except Exception:
        return id(node), -1


def remember(census_id: str, holders: dict[str, tuple[list[Any], list[Any]]]) -> None:
    """Keep, for the next census, each holder's sample tensors (weakly) and graph roots' keys.

    ``holders``: canonical path -> (sample tensors, grad_fn nodes)."""
    book: _Book = {}
    for path, (sample, nodes) in list(holders.items())[:MAX_HOLDERS]:
        refs = []
        for t in sample[:SAMPLE]:
            with contextlib.suppress(TypeError):
                refs.append(weakref.ref(t))
        book[path] = (refs, [node_key(n) for n in nodes[:ROOTS]])
    _BOOKS[census_id] = book
    while len(_BOOKS) > KEEP_CENSUSES:
        _BOOKS.popitem(last=False)


def known(census_id: Any) -> bool:
    return isinstance(census_id, str) and census_id in _BOOKS


def compare(previous_id: str, path_of: dict[int, str], graph_tensors: dict[str, list[Any]],
            node_budget: int) -> dict[str, dict[str, Any]]:
    """Per holder path of the previous census: {"kept", "sampled"} and, for a holder whose graph
    roots were recorded and that holds graph-carrying tensors now, "chained" (True / False /
    None when the search ran out of budget or the holder still holds the very same graph).

    ``path_of``: tensor id -> canonical path now; ``graph_tensors``: path -> graph-carrying
    tensors held there now (at most MAX_CHAINED)."""
    book = _BOOKS.get(previous_id)
    out: dict[str, dict[str, Any]] = {}
    if book is None:
        return out
    for path, (refs, roots) in book.items():
        kept = 0
        for ref in refs:
            t = ref()
            if t is not None and path_of.get(id(t)) == path:
                kept += 1
            t = None
        row: dict[str, Any] = {"kept": kept, "sampled": len(refs)}
        now = graph_tensors.get(path)
        if roots and now and node_budget > 0:
            starts = [fn for fn in (getattr(t, "grad_fn", None) for t in now) if fn is not None]
            own = {node_key(fn) for fn in starts}
            wanted = {key[0]: key[1] for key in roots if key not in own}
            if wanted and starts:
                chained, walked = reaches(starts, wanted, min(NODES_PER_HOLDER, node_budget))
                node_budget -= walked
                row["chained"] = chained
            starts.clear()
        out[path] = row
    return out
