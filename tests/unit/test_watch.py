"""watch, in-process: the handler runs in a thread while the test calls the watched function."""

from __future__ import annotations

import contextlib
import gc
import io
import sys
import textwrap
import threading
import time
import types
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from flight_profiler.agent import hooks, registry
from flight_profiler.agent.commands import watch as watch_cmd
from flight_profiler.agent.expressions import split_top_level
from flight_profiler.agent.registry import CommandError, Context

SOURCE = """
class Trainer:
    def __init__(self):
        self.lr = 0.5

    def step(self, x, scale=1):
        if x == 3:
            raise ValueError("three")
        return x * scale

    def __repr__(self):
        return "Trainer(lr=%s)" % self.lr

def work(x, **kw):
    return x

class Loud:
    def __repr__(self):
        return "Loud(%s)" % work(0)
"""


@pytest.fixture
def mod() -> Iterator[types.ModuleType]:
    name = f"fp_watch_{id(object())}"
    module = types.ModuleType(name)
    exec(textwrap.dedent(SOURCE), module.__dict__)
    sys.modules[name] = module
    originals = (module.Trainer.step.__code__, module.work.__code__)
    yield module
    del sys.modules[name]
    # every way a watch ends leaves the functions exactly as they were
    assert (module.Trainer.step.__code__, module.work.__code__) == originals
    assert module.Trainer.step.__code__ is originals[0] and module.work.__code__ is originals[1]
    assert not [d for d in hooks.active() if name in d]


class Run:
    """registry.run(ctx, cmd) in a thread, like the server does; events collected."""

    def __init__(self, cmd: str, args: dict[str, Any]) -> None:
        self.events: list[dict[str, Any]] = []
        self.started = threading.Event()
        self.ctx = Context(args, emit=self._emit)
        self.result: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(cmd,), daemon=True)
        self.thread.start()

    def _emit(self, data: dict[str, Any]) -> None:
        self.events.append(data)
        if data.get("type") in ("watching", "tracing"):
            self.started.set()

    def _run(self, cmd: str) -> None:
        try:
            self.result = registry.run(self.ctx, cmd)
        except BaseException as exc:
            self.error = exc
        finally:
            self.started.set()

    def wait_started(self) -> Run:
        assert self.started.wait(10), "the handler never started"
        if self.error:
            raise self.error
        return self

    def join(self) -> dict[str, Any]:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the handler did not stop"
        if self.error:
            raise self.error
        return self.result

    def calls(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "call"]


def spec(mod: types.ModuleType, method: str, cls: str | None = None) -> dict[str, Any]:
    return {"module": mod.__name__, "class": cls, "method": method, "nested": None}


def drive(trainer: Any, xs: list[int]) -> None:
    for x in xs:
        with contextlib.suppress(ValueError):
            trainer.step(x)


def test_default_view_and_count_of_matching_calls(mod: types.ModuleType) -> None:
    run = Run("watch", {"target": spec(mod, "step", "Trainer"), "count": 2, "filter": "params[0] >= 4"}).wait_started()
    drive(mod.Trainer(), [0, 1, 2, 4, 5, 6])
    result = run.join()
    calls = run.calls()
    # -n counts calls that MATCH: the 3 rejected calls before did not use up the count.
    # params are the arguments as bound, defaults included.
    assert [c["values"][0] for c in calls] == [["params", "(4, 1)"], ["params", "(5, 1)"]]
    assert [c["values"][1] for c in calls] == [["return_obj", "4"], ["return_obj", "5"]]
    assert calls[0]["values"][2][0] == "cost" and calls[0]["values"][2][1].endswith("s")
    assert result["reason"] == "count" and result["matched"] == 2 and result["calls"] >= 5
    assert run.events[0]["type"] == "watching" and run.events[0]["target"].endswith("Trainer.step")


def test_expressions_split_at_top_level_and_see_every_name(mod: types.ModuleType) -> None:
    exprs = "params[0], target, target.lr * 2, kwargs, cost >= 0, {'a': 1, 'b': (2, 3)}['b'], nope"
    run = Run("watch", {"target": spec(mod, "step", "Trainer"), "count": 1, "expr": exprs}).wait_started()
    mod.Trainer().step(7, scale=2)
    run.join()
    (call,) = run.calls()
    assert call["values"] == [
        ["params[0]", "7"], ["target", "Trainer(lr=0.5)"], ["target.lr * 2", "1.0"],
        ["kwargs", "{}"], ["cost >= 0", "True"], ["{'a': 1, 'b': (2, 3)}['b']", "(2, 3)"],
        ["nope", "<error: NameError: name 'nope' is not defined>"],
    ]


def test_exceptions_only_and_throw_exp(mod: types.ModuleType) -> None:
    run = Run("watch", {"target": spec(mod, "step", "Trainer"), "count": 1, "exceptions": True,
                        "expr": "throw_exp, return_obj"}).wait_started()
    drive(mod.Trainer(), [1, 2, 3, 4])
    run.join()
    (call,) = run.calls()
    assert call["exception"] == "ValueError: three"
    assert call["values"] == [["throw_exp", "ValueError: three"], ["return_obj", "None"]]


def test_filter_sees_cost_and_its_errors_are_reported(mod: types.ModuleType) -> None:
    run = Run("watch", {"target": spec(mod, "step", "Trainer"), "filter": "cost > 1e9"}).wait_started()
    drive(mod.Trainer(), [1, 2])
    time.sleep(0.1)
    run.ctx.cancel()
    result = run.join()
    assert run.calls() == [] and result["calls"] == 2 and result["reason"] == "cancelled"
    run = Run("watch", {"target": spec(mod, "step", "Trainer"), "filter": "params[0].shape[0] > 1",
                        "timeout": 0.3}).wait_started()
    drive(mod.Trainer(), [1, 2])
    result = run.join()
    assert result["reason"] == "timeout"
    assert result["filter_errors"] == 2
    assert result["first_filter_error"] == "AttributeError: 'int' object has no attribute 'shape'"
    assert {"type": "filter_error", "message": result["first_filter_error"]} in run.events


def test_cancel_and_timeout_remove_the_hook(mod: types.ModuleType) -> None:
    original = mod.work.__code__
    run = Run("watch", {"target": spec(mod, "work"), "timeout": 0.2}).wait_started()
    assert mod.work.__code__ is not original
    assert run.join()["reason"] == "timeout"
    assert mod.work.__code__ is original
    run = Run("watch", {"target": spec(mod, "work")}).wait_started()
    run.ctx.agent.remove_all()  # what detach does
    assert run.join()["reason"] == "cancelled"
    assert mod.work.__code__ is original


def test_client_gone_cancels(mod: types.ModuleType) -> None:
    class Gone:
        def __init__(self) -> None:
            self.n = 0

        def __call__(self, data: dict[str, Any]) -> None:
            self.n += 1
            if self.n > 1:
                raise BrokenPipeError("client went away")

    emit = Gone()
    ctx = Context({"target": spec(mod, "work")}, emit=emit)
    thread = threading.Thread(target=registry.run, args=(ctx, "watch"), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while emit.n < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    mod.work(1)
    thread.join(5)
    assert not thread.is_alive() and ctx.cancelled


def test_flood_drops_with_a_count_and_stays_bounded(
    mod: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    states: list[Any] = []

    class SpiedState(watch_cmd._State):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            states.append(self)

    monkeypatch.setattr(watch_cmd, "_State", SpiedState)
    events: list[dict[str, Any]] = []

    def slow_emit(data: dict[str, Any]) -> None:  # a client that cannot keep up
        events.append(data)
        time.sleep(0.01)

    run_box: dict[str, Any] = {}
    ctx = Context({"target": spec(mod, "work"), "timeout": 30}, emit=slow_emit)
    thread = threading.Thread(target=lambda: run_box.update(registry.run(ctx, "watch")), daemon=True)
    thread.start()
    while not states:
        time.sleep(0.01)
    time.sleep(0.05)
    peak = 0
    for i in range(50_000):
        mod.work(i)
        if i % 500 == 0:
            peak = max(peak, len(states[0].queue))
    deadline = time.monotonic() + 5
    while not any(e["type"] == "dropped" for e in events) and time.monotonic() < deadline:
        time.sleep(0.01)  # the drop notice comes while the backlog is still being sent
    ctx.cancel()  # Ctrl-C: ends at once, however much the slow client still has to read
    thread.join(5)
    assert not thread.is_alive(), "a slow client kept the watch alive after cancel"
    result = run_box
    assert result["reason"] == "cancelled"
    assert result["dropped"] > 40_000
    assert result["events"] + result["dropped"] == result["matched"] == 50_000
    assert peak <= watch_cmd.QUEUE_MAX
    assert any(e["type"] == "dropped" for e in events)


def test_no_reference_to_a_watched_argument_is_kept(mod: types.ModuleType) -> None:
    class Big:
        pass

    run = Run("watch", {"target": spec(mod, "work"), "expr": "params, return_obj"}).wait_started()
    arg = Big()
    ref = weakref.ref(arg)
    mod.work(arg)
    del arg
    gc.collect()
    assert ref() is None  # gone while the watch is still active
    time.sleep(0.1)
    run.ctx.cancel()
    run.join()
    assert run.calls()[0]["values"][0][1] == "(Big(),)"


def test_repr_calling_the_watched_function_does_not_recurse(mod: types.ModuleType) -> None:
    run = Run("watch", {"target": spec(mod, "work"), "count": 1}).wait_started()
    assert mod.work(mod.Loud()).__class__.__name__ == "Loud"
    run.join()
    (call,) = run.calls()
    assert call["values"][0] == ["params", "(Loud(0),)"]


def test_module_namespace_untouched(mod: types.ModuleType) -> None:
    before = set(vars(mod))
    run = Run("watch", {"target": spec(mod, "work"), "count": 1, "filter": "params[0] == 1"}).wait_started()
    mod.work(1)
    run.join()
    assert set(vars(mod)) == before


def test_bad_expression_and_target_are_usage_errors(mod: types.ModuleType) -> None:
    with pytest.raises(CommandError) as err:
        registry.run(Context({"target": spec(mod, "work"), "expr": "params["}), "watch")
    assert err.value.kind == "usage" and "invalid --expr 'params['" in err.value.message
    with pytest.raises(CommandError) as err:
        registry.run(Context({"target": spec(mod, "work"), "count": "three"}), "watch")
    assert err.value.kind == "usage" and err.value.message == "count must be a number, got 'three'"
    with pytest.raises(CommandError) as err:
        registry.run(Context({"target": spec(mod, "wrok")}), "watch")
    assert err.value.kind == "not_found" and "did you mean 'work'?" in err.value.message


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("params, cost", ["params", "cost"]),
        ("params[0].shape, cost", ["params[0].shape", "cost"]),
        ("f(a, b), {'x': 1, 'y': [1, 2]}, 'a,b'", ["f(a, b)", "{'x': 1, 'y': [1, 2]}", "'a,b'"]),
        ('"q\\",x", y', ['"q\\",x"', "y"]),
    ],
)
def test_split_top_level(text: str, parts: list[str]) -> None:
    assert split_top_level(text) == parts


def test_cli_builds_the_request_and_renders() -> None:
    from rich.console import Console

    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.errors import UsageError
    from flight_profiler.requests import parse

    req = parse("watch __main__ Trainer step -n 3 --expr 'params[0].shape, cost' -f 'cost > 1' -x 2 -nm inner -e")
    shown = rendering(req.cmd)
    assert req.cmd == "watch"
    assert req.args == {
        "target": {"module": "__main__", "class": "Trainer", "method": "step", "nested": "inner"},
        "expr": "params[0].shape, cost", "filter": "cost > 1", "exceptions": True, "expand": 2,
        "count": 3, "timeout": 0,
    }
    with pytest.raises(UsageError, match="invalid -f expression"):
        parse("watch m f -f 'cost >'")
    with pytest.raises(UsageError):
        parse("watch m f -n 0")
    out = io.StringIO()
    console = Console(file=out, width=120)
    assert shown.event is not None
    shown.event({"type": "watching", "target": "m.f", "count": 3}, console)
    shown.event({"type": "call", "n": 1, "ts": 0, "thread": "MainThread", "cost_ms": 1.5,
                      "values": [["params", "(1,)"], ["cost", "1.50 ms"]], "exception": None}, console)
    shown.event({"type": "dropped", "count": 5, "total": 5}, console)
    shown.result({"reason": "count", "calls": 10, "matched": 3, "events": 3, "dropped": 5,
                       "elapsed_s": 1.0}, console)
    text = out.getvalue()
    assert "watching m.f, up to 3 call(s)" in text
    assert "#1 MainThread  cost 1.50 ms" in text and "params = (1,)" in text
    assert "5 matching call(s) not shown" in text
    assert "watch ended (count reached)" in text and "5 dropped" in text


def test_cli_short_help_and_unwrapped_summary_lines() -> None:
    from rich.console import Console

    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.requests import HelpShown, parse

    for command in ("watch -h", "trace -h"):  # -h works as in the torch commands
        with pytest.raises(HelpShown):
            parse(command)
    for command in ("watch m f -n 1", "trace m f"):
        req = parse(command)
        shown = rendering(req.cmd)
        out = io.StringIO()
        console = Console(file=out, width=40)  # piped output: rich assumes 80 columns
        shown.result({"reason": "count", "calls": 4, "matched": 3, "events": 3, "elapsed_s": 0.1}, console)
        # one line per message, so that `| grep "hooks removed"` still finds it
        assert out.getvalue().count("\n") == 1 and "hooks removed" in out.getvalue()
