"""trace, in-process: the call tree of a call made by the test while the handler runs."""

from __future__ import annotations

import gc
import io
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from test_watch import Run

from flight_profiler.agent import hooks, registry
from flight_profiler.agent.commands import trace as trace_mod
from flight_profiler.agent.commands.trace import MAX_NODES, build_tree, make_recorder
from flight_profiler.agent.registry import CommandError, Context

SOURCE = """
import time

def tiny(i):
    return i + 1

def slow():
    time.sleep(0.003)

def leaf():
    return sorted([3, 1, 2])

def work(x):
    s = 0
    for i in range(30):
        s += i * x
    return s

class Model:
    def step(self, n):
        total = 0
        for i in range(50):
            total += tiny(i)
        slow()
        leaf()
        if n < 0:
            raise ValueError("negative")
        return total

    def deep(self, d):
        return self.deep(d - 1) if d else leaf()

    def gen(self):
        yield 1

    def small(self, n):
        total = 0
        for i in range(50):
            total += work(i)
        return total
"""


@pytest.fixture
def mod() -> Iterator[types.ModuleType]:
    name = f"fp_trace_{id(object())}"
    module = types.ModuleType(name)
    exec(textwrap.dedent(SOURCE), module.__dict__)
    sys.modules[name] = module
    original = module.Model.step.__code__
    yield module
    del sys.modules[name]
    assert module.Model.step.__code__ is original
    assert not [d for d in hooks.active() if name in d]
    assert sys.getprofile() is None


def spec(mod: types.ModuleType, method: str = "step") -> dict[str, Any]:
    return {"module": mod.__name__, "class": "Model", "method": method, "nested": None}


def names(node: dict[str, Any]) -> list[str]:
    return [c["name"] for c in node.get("children", [])]


def test_tree_with_times_counts_and_hidden_summary(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod), "count": 1, "min_ms": 0.1}).wait_started()
    mod.Model().step(1)
    result = run.join()
    (event,) = [e for e in run.events if e["type"] == "trace"]
    tree = event["tree"]
    assert tree["name"].endswith("Model.step") and tree["count"] == 1
    assert tree["ms"] >= 3.0
    # slow() (3 ms) is shown with its file:line; the 50 tiny calls and leaf() are faster than
    # 0.1 ms: one summary line with their count, never one line each
    assert names(tree) == ["slow"]
    slow = tree["children"][0]
    assert slow["ms"] >= 3.0 and slow["line"] == 7 and slow["file"] == "<string>"
    assert tree["hidden"]["count"] == 51
    assert 0 < tree["hidden"]["ms"] < 3.0
    assert result["reason"] == "count" and result["matched"] == 1


def test_aggregated_by_call_path_and_c_calls(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod), "count": 1, "min_ms": 0, "c_calls": True}).wait_started()
    mod.Model().step(1)
    run.join()
    tree = next(e for e in run.events if e["type"] == "trace")["tree"]
    by_name = {c["name"]: c for c in tree["children"]}
    assert by_name["tiny"]["count"] == 50  # one node for the 50 calls a loop makes
    assert names(by_name["slow"]) == ["builtin time.sleep"]
    assert names(by_name["leaf"]) == ["builtin builtins.sorted"]
    # children in first-call order
    assert [n for n in names(tree) if not n.startswith("builtin")] == ["tiny", "slow", "leaf"]


def test_depth_limit_and_recursion(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod, "deep"), "count": 1, "min_ms": 0, "depth": 2}).wait_started()
    # a collection during the call runs finalizers of earlier tests' garbage (torch's): calls
    # in this tree too, counted below -d (seen after test_torch_tensors.py)
    gc.collect()
    gc.disable()
    try:
        mod.Model().deep(5)
    finally:
        gc.enable()
    run.join()
    tree = next(e for e in run.events if e["type"] == "trace")["tree"]
    level1 = tree["children"][0]
    assert level1["name"] == "Model.deep"
    level2 = level1["children"][0]
    assert level2["name"] == "Model.deep" and "children" not in level2
    assert level2["hidden"]["count"] == 1  # what lies deeper than -d is summarised
    assert level2["hidden"].get("deeper") is True  # ... and said to be deeper, not faster (-i 0)


def test_cli_says_deeper_not_faster_for_depth_cut_subtrees() -> None:
    from rich.console import Console

    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.requests import parse

    req = parse("trace m f -d 1")
    shown = rendering(req.cmd)
    out = io.StringIO()
    assert shown.event is not None
    tree = {"name": "m.f", "file": "/x/t.py", "line": 1, "count": 1, "ms": 14.0,
            "children": [{"name": "g", "file": "/x/t.py", "line": 5, "count": 1, "ms": 13.9,
                          "hidden": {"count": 1, "ms": 13.8, "deeper": True}}]}
    shown.event({"type": "trace", "n": 1, "ts": 0, "thread": "MainThread", "cost_ms": 14.0,
                      "params": "()", "exception": None, "tree": tree}, Console(file=out, width=120))
    assert "└─ … 1 deeper call(s) hidden (13.80 ms total)" in out.getvalue()
    assert "faster" not in out.getvalue()


def test_filter_on_params_is_checked_before_profiling(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod), "count": 1, "filter": "params[0] == 7"}).wait_started()
    model = mod.Model()
    model.step(1)
    model.step(7)
    result = run.join()
    events = [e for e in run.events if e["type"] == "trace"]
    assert [e["params"] for e in events] == ["(7,)"]
    assert result["calls"] == 2 and result["matched"] == 1


def test_filter_on_cost_and_exceptions(mod: types.ModuleType) -> None:
    run = Run("trace", {"target": spec(mod), "count": 1, "filter": "throw_exp is not None"}).wait_started()
    model = mod.Model()
    model.step(1)
    with pytest.raises(ValueError):
        model.step(-1)
    run.join()
    (event,) = [e for e in run.events if e["type"] == "trace"]
    assert event["exception"] == "ValueError: negative" and event["params"] == "(-1,)"


def test_only_the_traced_thread_is_profiled(mod: types.ModuleType) -> None:
    other_profile: list[Any] = []
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            other_profile.append(sys.getprofile())
            mod.tiny(1)
            time.sleep(0.001)

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    run = Run("trace", {"target": spec(mod), "count": 2}).wait_started()
    model = mod.Model()
    seen_inside: list[Any] = []
    original_leaf = mod.leaf

    def spy() -> Any:
        seen_inside.append(sys.getprofile())
        return original_leaf()

    mod.leaf = spy
    try:
        model.step(1)
        model.step(2)
    finally:
        mod.leaf = original_leaf
    run.join()
    stop.set()
    thread.join(5)
    assert all(p is not None for p in seen_inside)  # the traced call was profiled...
    assert sys.getprofile() is None  # ...and not after it
    assert set(other_profile) == {None}  # the other thread never was
    trees = [e["tree"] for e in run.events if e["type"] == "trace"]
    assert all("tiny" not in str(c.get("children")) for t in trees for c in t.get("children", []) if c["name"] == "spy")


def test_existing_profiler_is_left_alone(mod: types.ModuleType) -> None:
    def user_profiler(frame: Any, event: str, arg: Any) -> None:
        pass

    run = Run("trace", {"target": spec(mod), "timeout": 0.3}).wait_started()
    sys.setprofile(user_profiler)
    try:
        mod.Model().step(1)
        assert sys.getprofile() is user_profiler
    finally:
        sys.setprofile(None)
    result = run.join()
    assert result["skipped_already_profiled"] == 1 and result["matched"] == 0


def test_generators_are_refused_with_a_pointer_to_watch(mod: types.ModuleType) -> None:
    with pytest.raises(CommandError) as err:
        registry.run(Context({"target": spec(mod, "gen")}), "trace")
    assert err.value.kind == "usage" and "use `watch`" in err.value.hint


def test_node_count_is_bounded() -> None:
    codes = [compile(f"def f{i}(): pass", "<gen>", "exec").co_consts[0] for i in range(MAX_NODES + 50)]

    def traced() -> None:
        pass

    profile, root, info = make_recorder(traced.__code__, False)

    class Frame:
        def __init__(self, code: types.CodeType) -> None:
            self.f_code = code

    profile(Frame(traced.__code__), "call", None)
    for code in codes:
        profile(Frame(code), "call", None)
        profile(Frame(code), "return", None)
    profile(Frame(traced.__code__), "return", None)
    assert info[0] == MAX_NODES + 1  # the cap plus one overflow node
    body = next(iter(root.values()))[2]
    shown, _hidden_calls, _ = build_tree(body, 0, 0)
    assert shown[-1]["name"] == "<more call paths than the trace keeps>" and shown[-1]["count"] == 51


def test_cli_renders_the_tree() -> None:
    from rich.console import Console

    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.requests import parse

    req = parse("trace __main__ Model step -i 0.5 -d 3 -n 2 --c-calls -f 'cost > 1'")
    shown = rendering(req.cmd)
    assert req.args == {
        "target": {"module": "__main__", "class": "Model", "method": "step", "nested": None},
        "min_ms": 0.5, "depth": 3, "count": 2, "filter": "cost > 1", "timeout": 0, "c_calls": True,
    }
    out = io.StringIO()
    console = Console(file=out, width=120)
    assert shown.event is not None
    tree = {"name": "m.Model.step", "file": "/x/train.py", "line": 3, "count": 1, "ms": 12.3,
            "children": [{"name": "forward", "file": "/x/model.py", "line": 9, "count": 3, "ms": 8.1,
                          "children": [{"name": "builtin torch._C._nn.linear", "file": "", "line": 0,
                                        "count": 3, "ms": 7.9}]}],
            "hidden": {"count": 48, "ms": 3.1}}
    shown.event({"type": "trace", "n": 1, "ts": 0, "thread": "MainThread", "cost_ms": 12.3,
                      "params": "(1,)", "exception": None, "tree": tree}, console)
    text = out.getvalue()
    assert "├─ 8.10 ms forward ×3" in text
    assert "│  └─ 7.90 ms builtin torch._C._nn.linear ×3" in text
    assert "└─ … 48 faster call(s) hidden (3.10 ms total)" in text


class _Frame:
    def __init__(self, code: types.CodeType) -> None:
        self.f_code = code


def _code(name: str) -> types.CodeType:
    code: types.CodeType = compile(f"def {name}(): pass", "<gen>", "exec").co_consts[0]
    return code


def test_the_last_child_shortcut_aggregates_as_the_dict_does() -> None:
    """A node remembers its last child (the loop's callee) to skip the lookup: calls that
    alternate, nest, or come back after another still land on their own call paths."""
    root_code, f, g, h = _code("traced"), _code("f"), _code("g"), _code("h")
    profile, root, info = make_recorder(root_code, False)

    def call(code: types.CodeType, *inner: types.CodeType) -> None:
        profile(_Frame(code), "call", None)
        for sub in inner:
            call(sub)
        profile(_Frame(code), "return", None)

    profile(_Frame(root_code), "call", None)
    for sequence in ([f], [f], [g], [f, h], [g, f], [f]):
        call(*sequence)
    profile(_Frame(root_code), "return", None)
    body = next(iter(root.values()))[2]
    shown, _, _ = build_tree(body, 0, 0)
    assert [(n["name"], n["count"]) for n in shown] == [("f", 4), ("g", 2)]
    f_node, g_node = shown
    assert [(n["name"], n["count"]) for n in f_node["children"]] == [("h", 1)]
    assert [(n["name"], n["count"]) for n in g_node["children"]] == [("f", 1)]
    assert info == [5, 1, 1]  # traced, f, g, f>h, g>f; done; f on two call paths


def test_the_tree_is_built_by_the_handler_not_the_traced_thread(
    mod: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The traced thread records; the handler thread builds the tree when it sends the event
    (issue 23: what a traced call costs its thread). On the old code build_tree ran in the
    traced thread, inside the hook's on_exit."""
    built_in: set[int] = set()
    real = trace_mod.build_tree

    def spy(*args: Any, **kwargs: Any) -> Any:
        built_in.add(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(trace_mod, "build_tree", spy)
    run = Run("trace", {"target": spec(mod, "small"), "count": 3, "min_ms": 0}).wait_started()
    model = mod.Model()
    for i in range(3):
        model.small(i)
    result = run.join()
    events = [e for e in run.events if e["type"] == "trace"]
    assert result["matched"] == 3 and len(events) == 3
    assert [e["n"] for e in events] == [1, 2, 3]
    assert all(names(e["tree"]) == ["work"] and e["tree"]["children"][0]["count"] == 50 for e in events)
    assert all(e["params"] == f"({i},)" for i, e in enumerate(events)), [e["params"] for e in events]
    assert all(e["thread"] == threading.current_thread().name for e in events)
    assert built_in == {run.thread.ident}


def test_a_tree_that_cannot_be_built_is_counted_dropped_and_the_stream_goes_on(
    mod: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure building one event (on the handler thread now) loses that event, counted,
    and nothing else: the next call is still traced and sent, and the traced thread never saw
    it (on the old code the failure was the hook's: a callback error in the traced thread)."""
    real = trace_mod.build_tree
    failures = [RecursionError("deep")]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(trace_mod, "build_tree", flaky)
    run = Run("trace", {"target": spec(mod, "small"), "count": 2, "min_ms": 0}).wait_started()
    model = mod.Model()
    assert [model.small(1), model.small(2)] == [sum(mod.work(i) for i in range(50))] * 2
    result = run.join()
    events = [e for e in run.events if e["type"] == "trace"]
    assert [e["n"] for e in events] == [2]
    assert result["dropped"] == 1 and result["events"] == 1 and result["callback_errors"] == 0


def test_a_traced_step_of_50_small_calls_stays_within_a_ratio(mod: types.ModuleType) -> None:
    """Issue 23's trace measurement as a CI-safe ratio (bench_watch.py trace-small): a method
    making 50 calls of ~1 us, EVERY call traced, its tree built and its event sent, the
    handler's work included (the command ends by -n and is joined inside the measurement).
    CPU time of the process, best of alternating rounds. Measured 3.4-3.5x on 3.11 with the
    Python recorder, 2.7-2.8x since calls after the first are recorded in C (trace_lsprof.py;
    any profile function costs ~2x there); the margin is generous: a traced call ~45% dearer
    than the Python recorder's fails it (two more Python calls per profile event made it 3.8x)."""
    model = mod.Model()
    calls = 40

    def loop() -> float:
        started = time.process_time()
        for i in range(calls):
            model.small(i)
        return time.process_time() - started

    base, traced = [], []
    for _ in range(10):  # alternating, so a burst of load hits both alike
        base.append(loop())
        run = Run("trace", {"target": spec(mod, "small"), "count": calls, "min_ms": 0}).wait_started()
        started = time.process_time()
        loop()
        result = run.join()
        traced.append(time.process_time() - started)
        assert result["matched"] == calls and result["events"] == calls, result
    ratio = min(traced) / min(base)
    assert ratio < 5.0, f"tracing every call of a 50-call step made it {ratio:.2f}x slower"
