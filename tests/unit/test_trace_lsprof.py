"""trace on CPython <= 3.11 records in C (cProfile's _lsprof) once a call proved tree-shaped;
the tree stays the exact one, and says so where it cannot be (trace_lsprof.py)."""

from __future__ import annotations

import gc
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from test_watch import Run

from flight_profiler.agent import hooks, trace_lsprof
from flight_profiler.agent.commands.trace import MAX_NODES, MAX_TREE_DEPTH
from flight_profiler.cli.agent_commands.trace import tree_lines

SOURCE = """
import sys

PROBE = []  # the kind of profile function of the thread, seen from inside each traced call
ON_LEAF = []  # what the next leaf call runs first

def leaf(x):
    PROBE.append(type(sys.getprofile()).__name__)  # not the profiler: that would keep it
    while ON_LEAF:
        ON_LEAF.pop()()
    return x + 1

def helper(x):
    return leaf(x)

def a(x):
    return helper(x)

def b(x):
    return x * 2

def other_b(x):
    return helper(x)

class Model:
    def step(self, n, twice=False):
        total = (other_b if twice else b)(n)  # the cheap one first: the order is first-call
        for i in range(20):
            total += a(i)
        return total

    def shared(self, n):
        return a(n) + other_b(n)
"""

IN_C = sys.version_info < (3, 12)


@pytest.fixture
def mod() -> Iterator[types.ModuleType]:
    name = f"fp_trace_lsprof_{id(object())}"
    module = types.ModuleType(name)
    exec(textwrap.dedent(SOURCE), module.__dict__)
    sys.modules[name] = module
    yield module
    del sys.modules[name]
    assert not [d for d in hooks.active() if name in d]
    assert sys.getprofile() is None


def spec(mod: types.ModuleType, method: str = "step") -> dict[str, Any]:
    return {"module": mod.__name__, "class": "Model", "method": method, "nested": None}


def shape(node: dict[str, Any]) -> list[Any]:
    """The tree without its times."""
    return [(c["name"], c["count"], c.get("summed_over_callers"), shape(c)) for c in node.get("children", [])]


def recorders(mod: types.ModuleType) -> list[str]:
    """Per leaf call: "C" (an _lsprof profiler) or "py" (a Python profile function)."""
    return ["py" if p == "function" else "C" if p == "Profiler" else p for p in mod.PROBE]


def traces(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events if e["type"] == "trace"]


def test_calls_after_a_tree_shaped_one_are_recorded_in_c_with_the_same_tree(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod), "count": 3, "min_ms": 0}).wait_started()
    model = mod.Model()
    for i in range(3):
        model.step(i)
    run.join()
    events = traces(run)
    assert len(events) == 3
    per_call = recorders(mod)
    assert per_call[:20] == ["py"] * 20  # the first call: exactly, by call path
    assert per_call[20:] == (["C"] if IN_C else ["py"]) * 40
    trees = [shape(e["tree"]) for e in events]
    assert trees[0] == [("b", 1, None, []),
                        ("a", 20, None, [("helper", 20, None, [("leaf", 20, None, [])])])]
    assert trees[1] == trees[0] and trees[2] == trees[0]
    assert [e["nodes"] for e in events] == [5, 5, 5]


@pytest.mark.skipif(not IN_C, reason="_lsprof records in C on CPython <= 3.11 only")
def test_a_call_that_leaves_the_known_shape_is_marked_then_recorded_exactly(mod: types.ModuleType) -> None:
    """Call 2 reaches helper from a AND other_b: _lsprof cannot split what helper called by
    caller, so the tree says so on both helper nodes, and call 3 is recorded exactly again."""
    run = Run("trace", {"target": spec(mod), "count": 3, "min_ms": 0}).wait_started()
    model = mod.Model()
    model.step(0)
    model.step(1, twice=True)
    # the handler thread finds out when it builds call 2's tree (the traced thread only
    # records): the calls made before that are recorded in C, and marked alike
    deadline = time.monotonic() + 10
    while len(traces(run)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    model.step(2)
    run.join()
    events = traces(run)
    assert recorders(mod) == ["py"] * 20 + ["C"] * 21 + ["py"] * 20
    summed = [("leaf", 21, None, [])]  # both callers' leaf calls, under each
    # other_b, new in this shape, comes after the known children (_lsprof keeps no order)
    assert shape(events[1]["tree"]) == [("a", 20, None, [("helper", 20, 2, summed)]),
                                        ("other_b", 1, None, [("helper", 1, 2, summed)])]
    assert shape(events[2]["tree"]) == shape(events[0]["tree"])
    assert "summed_over_callers" not in str(events[2]["tree"])


def test_a_first_call_on_two_paths_keeps_the_exact_recorder(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod, "shared"), "count": 2, "min_ms": 0}).wait_started()
    model = mod.Model()
    model.shared(1)
    model.shared(2)
    run.join()
    assert recorders(mod) == ["py"] * 4
    exact = [("a", 1, None, [("helper", 1, None, [("leaf", 1, None, [])])]),
             ("other_b", 1, None, [("helper", 1, None, [("leaf", 1, None, [])])])]
    assert [shape(e["tree"]) for e in traces(run)] == [exact, exact]


@pytest.mark.skipif(not IN_C, reason="_lsprof records in C on CPython <= 3.11 only")
def test_a_profiler_the_traced_code_displaced_never_unsets_the_new_one(mod: types.ModuleType) -> None:
    """Freed while still enabled, an _lsprof profiler unsets the profile function of the thread
    that frees it: the user's, had the traced thread dropped it. The call is not sent (the
    filter on the result rejects it), so the profiler waits for the handler thread."""
    def user_profiler(frame: Any, event: str, arg: Any) -> None:
        pass

    run = Run("trace", {"target": spec(mod), "filter": "return_obj == -1", "timeout": 0.5}).wait_started()
    model = mod.Model()
    model.step(0)  # exact, tree-shaped: the next call is recorded in C
    mod.ON_LEAF.append(lambda: sys.setprofile(user_profiler))
    try:
        model.step(1)
        gc.collect()
        assert sys.getprofile() is user_profiler
        result = run.join()
        assert sys.getprofile() is user_profiler
    finally:
        sys.setprofile(None)
    assert recorders(mod)[20] == "C"
    assert result["matched"] == 0 and result["calls"] == 2
    assert trace_lsprof._displaced == []  # released by the handler


@pytest.mark.skipif(not IN_C, reason="_lsprof records in C on CPython <= 3.11 only")
def test_recursion_is_marked_and_never_expanded_in_a_loop() -> None:
    def rec(d: int) -> int:
        return rec(d - 1) if d else 0

    profiler = trace_lsprof.start()
    rec(50)
    profiler.disable()
    stats = trace_lsprof.release(profiler)
    body, nodes, callers, shaped = trace_lsprof.to_nodes(stats, rec.__code__, None, MAX_NODES, MAX_TREE_DEPTH + 1)
    assert not shaped and callers == 2 and nodes == 2
    (node,) = body.values()
    assert node[0] == 50 and node[2] == {} and node[6] == 2  # rec under rec, not expanded


def test_the_cli_says_which_calls_are_summed_over_callers() -> None:
    tree = {"name": "m.step", "file": "/x/t.py", "line": 1, "count": 1, "ms": 2.0,
            "children": [{"name": "helper", "file": "/x/t.py", "line": 5, "count": 20, "ms": 1.0,
                          "summed_over_callers": 2,
                          "children": [{"name": "leaf", "file": "/x/t.py", "line": 9, "count": 21,
                                        "ms": 0.5}]}]}
    lines = tree_lines(tree)
    assert "summed over its 2 callers" in lines[0] and "summed" not in lines[1]
