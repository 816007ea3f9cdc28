"""targets.resolve: every kind of target, and one clear line for every kind of typo."""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any, Callable

import pytest

from flight_profiler.agent.registry import CommandError
from flight_profiler.agent.targets import resolve

SOURCE = """
import functools

def train_step(batch):
    return batch

def decorate(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k)
    return wrapper

@decorate
def decorated(x):
    return x

async def fetch(x):
    return x

def batches(n):
    yield from range(n)

async def stream(n):
    for i in range(n):
        yield i

def outer(k):
    def inner(z):
        def innermost():
            return z
        return innermost() + k
    return inner(1)

class Base:
    def step(self):
        return 1

class Trainer(Base):
    def forward(self, x):
        return x

    @classmethod
    def build(cls):
        return cls()

    @staticmethod
    def lr(epoch):
        return 0.1

    @property
    def device(self):
        return "cpu"

    class Inner:
        def run(self):
            return 2

trainer = Trainer()
builtin_alias = len
"""


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    name = f"fp_targets_{id(object())}"
    mod = types.ModuleType(name)
    exec(textwrap.dedent(SOURCE), mod.__dict__)
    sys.modules[name] = mod
    yield mod
    del sys.modules[name]


def spec(module: types.ModuleType, method: str, cls: str | None = None, nested: str | None = None) -> dict[str, Any]:
    return {"module": module.__name__, "class": cls, "method": method, "nested": nested}


@pytest.mark.parametrize(
    ("cls", "method", "kind", "bound", "func"),
    [
        (None, "train_step", "function", False, lambda m: m.train_step),
        ("Trainer", "forward", "method", True, lambda m: m.Trainer.forward),
        ("Trainer", "build", "classmethod", True, lambda m: m.Trainer.build.__func__),
        ("Trainer", "lr", "staticmethod", False, lambda m: m.Trainer.lr),
        ("Trainer", "device", "property", True, lambda m: m.Trainer.device.fget),
        ("Trainer.Inner", "run", "method", True, lambda m: m.Trainer.Inner.run),
        (None, "fetch", "function", False, lambda m: m.fetch),
        (None, "batches", "function", False, lambda m: m.batches),
        (None, "stream", "function", False, lambda m: m.stream),
        (None, "decorated", "function", False, lambda m: m.decorated.__wrapped__),
        ("trainer", "forward", "method", True, lambda m: m.Trainer.forward),
    ],
)
def test_each_kind_resolves_to_its_underlying_function(
    module: types.ModuleType, cls: str | None, method: str, kind: str, bound: bool,
    func: Callable[[types.ModuleType], types.FunctionType],
) -> None:
    target = resolve(spec(module, method, cls))
    assert target.function is func(module)
    assert target.code is func(module).__code__
    assert target.kind == kind
    assert target.bound_first is bound
    assert target.description == f"{module.__name__}.{cls + '.' if cls else ''}{method}"


def test_inherited_method_names_the_defining_class(module: types.ModuleType) -> None:
    target = resolve(spec(module, "step", "Trainer"))
    assert target.function is module.Base.step
    assert "Base" in target.note


def test_main_module_is_searchable(monkeypatch: pytest.MonkeyPatch) -> None:
    def fp_probe_step() -> int:
        return 1

    monkeypatch.setattr(sys.modules["__main__"], "fp_probe_step", fp_probe_step, raising=False)
    target = resolve({"module": "__main__", "class": None, "method": "fp_probe_step", "nested": None})
    assert target.function is fp_probe_step
    assert target.description == "__main__.fp_probe_step"
    with pytest.raises(CommandError) as err:
        resolve({"module": "__main__", "class": None, "method": "fp_probe_stp", "nested": None})
    assert "did you mean 'fp_probe_step'?" in err.value.message


def test_nested_function_found_through_code_constants(module: types.ModuleType) -> None:
    target = resolve(spec(module, "outer", nested="inner"))
    assert target.kind == "nested"
    assert target.function is module.outer
    assert target.code.co_name == "inner"
    assert target.code in module.outer.__code__.co_consts
    deeper = resolve(spec(module, "outer", nested="inner.innermost"))
    assert deeper.code.co_name == "innermost"
    assert deeper.description.endswith("outer.<locals>.inner.innermost")


def test_typo_in_method_suggests_the_close_name(module: types.ModuleType) -> None:
    with pytest.raises(CommandError) as err:
        resolve(spec(module, "trian_step"))
    assert err.value.message == f"no method 'trian_step' in {module.__name__}; did you mean 'train_step'?"
    assert err.value.kind == "not_found"
    assert "train_step" in err.value.hint


def test_typo_in_class_and_method_of_class(module: types.ModuleType) -> None:
    with pytest.raises(CommandError) as err:
        resolve(spec(module, "forward", "Trainr"))
    assert "no class 'Trainr'" in err.value.message and "'Trainer'" in err.value.message
    with pytest.raises(CommandError) as err:
        resolve(spec(module, "forwrd", "Trainer"))
    assert "no method 'forwrd' in" in err.value.message and "'forward'" in err.value.message


def test_typo_in_nested_name(module: types.ModuleType) -> None:
    with pytest.raises(CommandError) as err:
        resolve(spec(module, "outer", nested="iner"))
    assert "no nested function 'iner'" in err.value.message and "'inner'" in err.value.message


def test_module_not_imported_is_never_imported() -> None:
    assert "json.tool" not in sys.modules or pytest.skip("json.tool already imported")
    with pytest.raises(CommandError) as err:
        resolve({"module": "json.tool", "class": None, "method": "main", "nested": None})
    assert err.value.message == "module 'json.tool' is not imported in the target"
    assert err.value.kind == "not_found"
    assert "json.tool" not in sys.modules


def test_builtin_is_refused_with_a_reason(module: types.ModuleType) -> None:
    with pytest.raises(CommandError) as err:
        resolve(spec(module, "builtin_alias"))
    assert "not a Python function" in err.value.message
    assert err.value.kind == "usage"
