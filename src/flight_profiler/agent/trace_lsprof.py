"""trace's C recorder on CPython <= 3.11: cProfile's core (``_lsprof``) in place of a Python
profile function, for the calls of a trace whose call tree is known to be tree-shaped.

Why: a Python profile function is one Python call per call and return event; ``_lsprof``'s is
C. On 3.9-3.11 ``Profiler.enable()`` installs it with ``PyEval_SetProfile``, on the calling
thread only, as ``sys.setprofile`` does (on 3.12+ it uses ``sys.monitoring``, whose events are
global: never used there). Recording a method making 50 calls of ~1 µs, against the method
alone (bench/bench_trace_floor.py): the Python recorder 1.97x on 3.9, 2.64x on 3.11; this one
1.10x, 2.01x (3.11's floor: its eval loop runs unspecialised while any profile function is set,
an empty Python one 2.00x). docs/commands-watch-trace.md has the whole command's figures.

What it loses: ``_lsprof`` keeps caller -> callee pairs, not call paths. Below a function
called from one place only, the pairs are the path's own figures; a function called from
several places (or recursively) has its callees summed over all of them. So trace records a
call with the Python recorder first, and uses this one only for the following calls of a
trace whose last exactly recorded call was tree-shaped (every function on one call path).
If such a call turns out not to be (the code took another branch), its tree says so on the
nodes concerned (``summed_over_callers``: what the node called is summed over that many callers)
and trace goes back to the Python recorder (from the call after the handler thread built that
tree: the traced thread only records).

The profiler is enabled and disabled on the traced thread (``disable()`` unsets the CALLING
thread's profile function, whatever it is); its statistics are read, and it is released, on the
handler thread. One that the traced code displaced (``sys.setprofile`` of its own) is still
flagged enabled: freeing it would unset the profile function of the thread that frees it (the
user's), so it is disabled on the handler thread, an agent thread, before it is freed.
"""

from __future__ import annotations

import sys
import types
from typing import Any

try:
    import _lsprof

    AVAILABLE = sys.version_info < (3, 12)
except ImportError:  # a Python built without it: the Python recorder only
    AVAILABLE = False


def start() -> Any:
    """A new profiler, enabled on the calling thread (which must have no profile function)."""
    profiler = _lsprof.Profiler(builtins=False, subcalls=True)
    profiler.enable()
    return profiler


def release(profiler: Any) -> list[Any]:
    """Its statistics, and the profiler emptied. Runs on the handler thread."""
    # clears its flag; may unset the calling thread's profile function: an agent thread's
    profiler.disable()
    try:
        return list(profiler.getstats())
    finally:
        profiler.clear()


def displaced(profiler: Any) -> None:
    """The traced code set a profile function of its own over ``profiler`` (still flagged
    enabled): kept, emptied, until a handler thread can disable it (:func:`release_displaced`);
    one never released stays here rather than unset a profile function when freed."""
    profiler.clear()
    _displaced.append(profiler)


def release_displaced() -> None:
    """Disable, on the calling (handler) thread, the profilers :func:`displaced` kept."""
    while _displaced:
        _displaced.pop().disable()


_displaced: list[Any] = []


def to_nodes(
    stats: list[Any], code: types.CodeType, template: dict[Any, list[Any]] | None,
    max_nodes: int, max_depth: int,
) -> tuple[dict[Any, list[Any]], int, int, bool]:
    """The tree below ``code`` as trace's recorder nodes (commands/trace.py ``make_recorder``):
    (children of ``code``, node count (``code``'s included), callers of ``code`` (2 when it recursed), tree-shaped:
    every function in the tree had one caller and never recursed).

    A node is ``[count, total_ns, children, None, None, code, callers]``, ``callers`` 0 when its
    subtree is exact, else the number of functions calling it (at least 2: its children are
    summed over all of them; a function already on the path is not expanded again). Siblings
    come in ``template``'s order (the children of the same code in an exactly recorded call,
    in first-call order), then the new ones, dearest first. Runs on the handler thread.
    """
    by_id = {id(entry.code): entry for entry in stats}
    callers: dict[int, int] = {}
    for entry in stats:
        for sub in entry.calls or ():
            key = id(sub.code)
            callers[key] = callers.get(key, 0) + 1
    root: dict[Any, list[Any]] = {}
    top = by_id.get(id(code))
    if top is None:
        return root, 0, 1, True
    # the traced code's first caller is outside: the profiler started inside the hook
    root_callers = max(callers.get(id(code), 0) + 1, 2 if top.reccallcount else 1)
    shaped = root_callers == 1
    nodes = 1  # the traced call's own, as make_recorder counts
    # (lsprof entry, its node's children, template children, depth, codes on the path)
    todo: list[tuple[Any, dict[Any, list[Any]], dict[Any, list[Any]], int, frozenset[int]]] = [
        (top, root, template or {}, 1, frozenset((id(code),)))]
    while todo:
        entry, children, shape, depth, path = todo.pop()
        subs = entry.calls or ()
        if len(subs) > 1:
            order = {key: i for i, key in enumerate(shape)}
            last = len(order)
            subs = sorted(subs, key=lambda s: (order.get(id(s.code), last), -s.totaltime))
        for sub in subs:
            if nodes >= max_nodes:
                return root, nodes, root_callers, shaped
            key = id(sub.code)
            below = by_id.get(key)
            shared = callers.get(key, 0) + (sub.code is code)
            if shared > 1 or (below is not None and below.reccallcount):
                shaped = False
                shared = max(shared, 2)
            else:
                shared = 0
            node = [sub.callcount, int(sub.totaltime * 1e9), {}, None, None, sub.code, shared]
            children[key] = node
            nodes += 1
            if below is not None and below.calls and depth < max_depth and key not in path:
                kept = shape.get(key)
                todo.append((below, node[2], kept[2] if kept else {}, depth + 1, path | {key}))
    return root, nodes, root_callers, shaped
