"""hooks.install: every call seen, whatever the reference; exact restoration; composition."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import sys
import textwrap
import threading
import types
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from flight_profiler.agent import hooks
from flight_profiler.agent.targets import resolve

SOURCE = """
def f(a, b=2, /, c=3, *args, d, e=5, **kw):
    return (a, b, c, args, d, e, kw)

def boom(x):
    raise ValueError(x)

def gen(n):
    for i in range(n):
        got = yield i
        if got:
            yield got
    return "done"

async def co(x):
    await asyncio.sleep(0)
    return x + 1

async def agen(n):
    for i in range(n):
        got = yield i
        if got:
            yield got

def outer(k):
    def inner(z):
        return z + k
    return inner

class Model:
    def forward(self, x):
        return super().__repr__()[:1] + str(x)

    @classmethod
    def make(cls, n):
        return cls.__name__ * n

    @staticmethod
    def scale(v):
        return v * 3

    @property
    def size(self):
        return 42

def counter():
    total = 0
    def bump():
        nonlocal total
        total += 1
        return total
    return bump
"""


@pytest.fixture
def mod() -> Iterator[types.ModuleType]:
    name = f"fp_hooks_{id(object())}"
    module = types.ModuleType(name)
    module.__dict__["asyncio"] = asyncio
    exec(textwrap.dedent(SOURCE), module.__dict__)
    sys.modules[name] = module
    yield module
    del sys.modules[name]
    assert not [d for d in hooks.active() if name in d], "a test left a hook installed"


def target(mod: types.ModuleType, method: str, cls: str | None = None, nested: str | None = None) -> Any:
    return resolve({"module": mod.__name__, "class": cls, "method": method, "nested": nested})


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def enter(self, args: tuple, kwargs: dict) -> int:
        self.calls.append(("enter", args, dict(kwargs), threading.get_ident()))
        return len(self.calls)

    def exit(self, token: Any, value: Any, exc: BaseException | None, elapsed: int) -> None:
        self.calls.append(("exit", token, value, exc, elapsed, threading.get_ident()))


def test_args_kwargs_and_return_of_every_parameter_kind(mod: types.ModuleType) -> None:
    rec = Recorder()
    original = mod.f.__code__
    remove = hooks.install(target(mod, "f"), rec.enter, rec.exit)
    try:
        assert mod.f(1, d=4, z=9) == (1, 2, 3, (), 4, 5, {"z": 9})
        assert mod.f(1, 2, 3, 4, 5, d=1) == (1, 2, 3, (4, 5), 1, 5, {})
    finally:
        remove()
    assert rec.calls[0][:3] == ("enter", (1, 2, 3), {"d": 4, "e": 5, "z": 9})
    assert rec.calls[1][:4] == ("exit", 1, (1, 2, 3, (), 4, 5, {"z": 9}), None)
    assert rec.calls[2][:3] == ("enter", (1, 2, 3, 4, 5), {"d": 1, "e": 5})
    assert rec.calls[1][4] > 0
    assert rec.calls[0][3] == threading.get_ident()  # the caller's thread
    assert mod.f.__code__ is original


def test_hooked_code_stays_hashable_and_comparable(mod: types.ModuleType) -> None:
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def on_exit(self, *a: Any) -> None:
            pass

    remove = hooks.install(target(mod, "f"), None, Unhashable().on_exit)
    remove_n = hooks.install(target(mod, "outer", nested="inner"), None, Unhashable().on_exit)
    try:
        assert isinstance(hash(mod.f.__code__), int)  # profilers and torch.compile key by code
        assert isinstance(hash(mod.outer.__code__), int)
        assert mod.f.__code__ == mod.f.__code__
    finally:
        remove()
        remove_n()


def test_references_taken_before_install_see_the_hook(mod: types.ModuleType) -> None:
    rec = Recorder()
    imported_by_name = mod.f
    model = mod.Model()
    bound = model.forward
    remove = hooks.install(target(mod, "f"), None, rec.exit)
    remove_m = hooks.install(target(mod, "forward", "Model"), None, rec.exit)
    try:
        imported_by_name(0, d=0)
        assert bound(7) == "<7"  # zero-arg super() still works (the __class__ cell)
    finally:
        remove()
        remove_m()
    assert [c[2] for c in rec.calls] == [(0, 2, 3, (), 0, 5, {}), "<7"]
    # on_enter=None: the token is (args, kwargs)
    assert rec.calls[1][1] == ((model, 7), {})


@pytest.mark.parametrize(
    ("cls", "method", "call", "expected", "first_arg"),
    [
        ("Model", "make", lambda m: m.Model.make(2), "ModelModel", "cls"),
        ("Model", "scale", lambda m: m.Model().scale(2), 6, 2),
        ("Model", "size", lambda m: m.Model().size, 42, "self"),
    ],
)
def test_classmethod_staticmethod_property(
    mod: types.ModuleType, cls: str, method: str, call: Any, expected: Any, first_arg: Any
) -> None:
    rec = Recorder()
    remove = hooks.install(target(mod, method, cls), rec.enter, rec.exit)
    try:
        assert call(mod) == expected
    finally:
        remove()
    args = rec.calls[0][1]
    if first_arg == "cls":
        assert args[0] is mod.Model
    elif first_arg == "self":
        assert isinstance(args[0], mod.Model)
    else:
        assert args == (first_arg,)
    assert rec.calls[1][2] == expected


def test_exception_is_reported_and_propagates_unchanged(mod: types.ModuleType) -> None:
    rec = Recorder()
    remove = hooks.install(target(mod, "boom"), rec.enter, rec.exit)
    try:
        with pytest.raises(ValueError, match=r"^3$"):
            mod.boom(3)
    finally:
        remove()
    exc = rec.calls[1][3]
    assert isinstance(exc, ValueError) and exc.args == (3,)
    assert rec.calls[1][2] is None


def test_callback_errors_are_swallowed_and_counted(mod: types.ModuleType) -> None:
    def bad_enter(args: tuple, kwargs: dict) -> None:
        raise RuntimeError("enter")

    def bad_exit(*a: Any) -> None:
        raise RuntimeError("exit")

    remove = hooks.install(target(mod, "f"), bad_enter, bad_exit)
    try:
        assert mod.f(1, d=1)[0] == 1
    finally:
        remove()
    assert remove.hook.errors == 1  # type: ignore[attr-defined]  # exit skipped after a failed enter
    remove = hooks.install(target(mod, "f"), None, bad_exit)
    try:
        assert mod.f(1, d=1)[0] == 1
        with pytest.raises(ValueError):
            hooks_boom = hooks.install(target(mod, "boom"), None, bad_exit)
            try:
                mod.boom(1)
            finally:
                hooks_boom()
    finally:
        remove()
    assert remove.hook.errors == 1  # type: ignore[attr-defined]


def test_skip_lets_a_call_run_unobserved(mod: types.ModuleType) -> None:
    exits: list[Any] = []

    def enter(args: tuple, kwargs: Any) -> Any:
        return hooks.SKIP if args[0] % 2 else args[0]

    def on_exit(token: Any, value: Any, exc: Any, elapsed: int) -> None:
        exits.append((token, value))

    r1 = hooks.install(target(mod, "f"), enter, on_exit)
    r2 = hooks.install(target(mod, "gen"), enter, on_exit)
    try:
        assert [mod.f(i, d=0)[0] for i in range(4)] == [0, 1, 2, 3]
        assert list(mod.gen(3)) == [0, 1, 2] and list(mod.gen(2)) == [0, 1]
        with pytest.raises(ValueError):  # a skipped call still raises what it raises
            hooks_boom = hooks.install(target(mod, "boom"), lambda a, k: hooks.SKIP, on_exit)
            try:
                mod.boom(1)
            finally:
                hooks_boom()
        # with two hooks, each skips for itself
        r3 = hooks.install(target(mod, "f"), None, lambda t, v, e, n: exits.append(("both", v[0])))
        try:
            mod.f(5, d=0)
        finally:
            r3()
    finally:
        r1()
        r2()
    assert exits == [(0, mod.f(0, d=0)), (2, mod.f(2, d=0)), (2, "done"), ("both", 5)]


def test_generator_whole_life_and_send(mod: types.ModuleType) -> None:
    rec = Recorder()
    remove = hooks.install(target(mod, "gen"), rec.enter, rec.exit)
    try:
        assert inspect.isgeneratorfunction(mod.gen)
        g = mod.gen(2)
        assert rec.calls == []  # nothing runs before the first next()
        assert next(g) == 0
        assert g.send("x") == "x"
        assert list(g) == [1]
        early = mod.gen(5)
        next(early)
        early.close()
    finally:
        remove()
    kinds = [(c[0], c[2]) for c in rec.calls]
    assert kinds[:2] == [("enter", {}), ("exit", "done")]
    assert isinstance(rec.calls[3][3], GeneratorExit)


def test_coroutine_and_async_generator_stay_what_they_are(mod: types.ModuleType) -> None:
    rec = Recorder()
    r1 = hooks.install(target(mod, "co"), rec.enter, rec.exit)
    r2 = hooks.install(target(mod, "agen"), rec.enter, rec.exit)
    try:
        assert inspect.iscoroutinefunction(mod.co)
        assert inspect.isasyncgenfunction(mod.agen)

        async def main() -> tuple[int, list[int], list[Any]]:
            a = await mod.co(1)
            b = [x async for x in mod.agen(3)]
            ag = mod.agen(3)
            sent = [await ag.asend(None), await ag.asend("hi")]
            with pytest.raises(KeyError):
                await ag.athrow(KeyError("k"))
            return a, b, sent

        assert asyncio.run(main()) == (2, [0, 1, 2], [0, "hi"])
    finally:
        r1()
        r2()
    exits = [c for c in rec.calls if c[0] == "exit"]
    assert exits[0][2] == 2 and exits[0][3] is None
    assert exits[1][3] is None
    assert isinstance(exits[2][3], KeyError)


def test_nested_function_including_closures_made_before(mod: types.ModuleType) -> None:
    rec = Recorder()
    early = mod.outer(10)
    outer_code, inner_code = mod.outer.__code__, early.__code__
    remove = hooks.install(target(mod, "outer", nested="inner"), None, rec.exit)
    try:
        assert mod.outer(1)(2) == 3
        assert early(5) == 15
    finally:
        remove()
    assert [c[2] for c in rec.calls] == [3, 15]
    assert mod.outer.__code__ is outer_code
    assert early.__code__ is inner_code


def test_two_hooks_on_one_nested_function(mod: types.ModuleType) -> None:
    a, b = Recorder(), Recorder()
    outer_code = mod.outer.__code__
    ra = hooks.install(target(mod, "outer", nested="inner"), None, a.exit)
    rb = hooks.install(target(mod, "outer", nested="inner"), None, b.exit)  # resolved while hooked
    try:
        assert mod.outer(1)(2) == 3
        ra()
        assert mod.outer(1)(5) == 6
    finally:
        ra()
        rb()
    assert [c[2] for c in a.calls] == [3] and [c[2] for c in b.calls] == [3, 6]
    assert mod.outer.__code__ is outer_code


def test_nonlocal_writes_still_reach_the_shared_cell(mod: types.ModuleType) -> None:
    rec = Recorder()
    bump = mod.counter()
    remove = hooks.install(target(mod, "counter", nested="bump"), None, rec.exit)
    try:
        assert [bump(), bump()] == [1, 2]
        fresh = mod.counter()
        assert fresh() == 1
    finally:
        remove()
    assert bump() == 3
    assert [c[2] for c in rec.calls] == [1, 2, 1]


@pytest.mark.parametrize("order", ["fifo", "lifo"])
def test_hooks_compose_and_come_off_in_any_order(mod: types.ModuleType, order: str) -> None:
    a, b = Recorder(), Recorder()
    original = mod.f.__code__
    ra = hooks.install(target(mod, "f"), a.enter, a.exit)
    rb = hooks.install(target(mod, "f"), None, b.exit)
    mod.f(1, d=1)
    first, second = (ra, rb) if order == "fifo" else (rb, ra)
    first()
    first()  # idempotent
    mod.f(2, d=2)
    second()
    mod.f(3, d=3)
    assert mod.f.__code__ is original
    assert hooks.active() == [] or all(mod.__name__ not in d for d in hooks.active())
    seen_a = [c[2][0] for c in a.calls if c[0] == "exit"]
    seen_b = [c[2][0] for c in b.calls if c[0] == "exit"]
    if order == "fifo":
        assert (seen_a, seen_b) == ([1], [1, 2])
    else:
        assert (seen_a, seen_b) == ([1, 2], [1])


def test_outer_and_nested_hooks_compose_in_any_order(mod: types.ModuleType) -> None:
    outer_code = mod.outer.__code__
    for first_outer in (True, False):
        rec = Recorder()
        outer_t, inner_t = target(mod, "outer"), target(mod, "outer", nested="inner")
        order = (outer_t, inner_t) if first_outer else (inner_t, outer_t)
        r1, r2 = (hooks.install(t, None, rec.exit) for t in order)
        assert mod.outer(1)(2) == 3
        r1()
        assert mod.outer(1)(3) == 4
        r2()
        assert mod.outer(1)(4) == 5
        assert mod.outer.__code__ is outer_code
        values = [c[2] if isinstance(c[2], int) else "outer" for c in rec.calls]
        if first_outer:  # the outer hook came off first: the nested one still saw 3 + 1
            assert values == ["outer", 3, 4]
        else:
            assert values == ["outer", 3, "outer"]


def test_no_reference_to_arguments_survives_the_call(mod: types.ModuleType) -> None:
    class Arg:
        pass

    def on_exit(token: Any, value: Any, exc: Any, elapsed: int) -> None:
        pass

    remove = hooks.install(target(mod, "f"), lambda a, k: None, on_exit)
    try:
        arg = Arg()
        ref = weakref.ref(arg)
        mod.f(arg, d=None)
        del arg
        gc.collect()
        assert ref() is None
    finally:
        remove()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_functions_back(mod: types.ModuleType) -> None:
    original = mod.f.__code__
    inner_original = mod.outer(1).__code__
    seen: list[Any] = []
    remove = hooks.install(target(mod, "f"), None, lambda *a: seen.append(1))
    remove_n = hooks.install(target(mod, "outer", nested="inner"), None, lambda *a: seen.append(1))
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running pytest's teardown
            try:
                ok = (mod.f.__code__ is original and mod.outer(1).__code__ is inner_original
                      and not hooks.active() and not seen)
                os.write(write_end, b"clean" if ok else b"hooked")
            finally:
                os._exit(0)
        os.close(write_end)
        answer = os.read(read_end, 16)
        os.close(read_end)
        os.waitpid(pid, 0)
        assert answer == b"clean"
        assert mod.f.__code__ is not original  # the parent keeps its hook
        mod.f(1, d=1)
        assert seen == [1]
    finally:
        remove()
        remove_n()


def test_calls_from_many_threads_are_all_seen(mod: types.ModuleType) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def on_exit(token: Any, value: Any, exc: Any, elapsed: int) -> None:
        with lock:
            seen.append(threading.get_ident())

    remove = hooks.install(target(mod, "f"), None, on_exit)
    try:
        barrier = threading.Barrier(4)  # all alive at once, so their idents differ

        def work() -> None:
            barrier.wait(10)
            for i in range(200):
                mod.f(i, d=i)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        remove()
    assert len(seen) == 800
    assert len(set(seen)) == 4
