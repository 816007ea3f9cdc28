"""A small typed description of JSON shapes, checked once where an agent's answer enters the CLI.

The agent lives in a process another user controls and may be a fake: its answers are checked
against these shapes before anything renders or uses them, so that a string where a number was
expected, a frame without ``file`` or an integer of a thousand digits becomes one line ("the
agent's answer was malformed: stack: threads[0].frames[2].file: missing") instead of a traceback
somewhere in a renderer. Every check is iterative or bounded in depth (a nested answer cannot
exhaust the stack) and linear in the answer's size.

Objects accept keys they do not describe (a newer agent may add some); a described key must have
its type. ``None`` is accepted wherever a key is optional (``opt``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

# Integers the agent sends are counts, sizes, ids, timestamps: 2**64 covers them all. A bigger
# one (a thousand digits) costs quadratic time to format and overflows float().
MAX_INT = 1 << 64


class Mismatch(Exception):
    """``where``: the path to the value (``threads[0].frames[2].file``), ``what``: the problem."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}" if where else what)
        self.where = where
        self.what = what


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class Shape:
    """What a value must be. ``check`` raises :class:`Mismatch` naming the path."""

    expected = "a value"

    def check(self, value: Any, where: str = "") -> None:
        if not self.accepts(value):
            raise Mismatch(where, f"expected {self.expected}, got {_type_name(value)}")

    def accepts(self, value: Any) -> bool:
        return True


class _Any(Shape):
    expected = "any value"


class _Str(Shape):
    expected = "a string"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)


class _Bool(Shape):
    expected = "a boolean"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


class _Int(Shape):
    expected = "an integer"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def check(self, value: Any, where: str = "") -> None:
        super().check(value, where)
        if not -MAX_INT <= value <= MAX_INT:
            raise Mismatch(where, "an integer out of range")


class _Num(Shape):
    """An int or a float; NaN and infinities are numbers too (a gradient norm may be NaN)."""

    expected = "a number"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def check(self, value: Any, where: str = "") -> None:
        super().check(value, where)
        if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
            raise Mismatch(where, "an integer out of range")


class Finite(_Num):
    """A number that is neither NaN nor infinite (a duration, a size)."""

    expected = "a finite number"

    def check(self, value: Any, where: str = "") -> None:
        super().check(value, where)
        if isinstance(value, float) and not math.isfinite(value):
            raise Mismatch(where, f"expected a finite number, got {value}")


class _Never(Shape):
    """Nothing is accepted: e.g. the events of a command that streams none."""

    expected = "nothing"

    def accepts(self, value: Any) -> bool:
        return False

    def check(self, value: Any, where: str = "") -> None:
        raise Mismatch(where, "this command sends no events")


class Rule(Shape):
    """``shape``, then ``problem(value)`` (None when the value is right): a relation between
    fields that a shape cannot say (e.g. every measurement covers every model)."""

    def __init__(self, shape: Shape, problem: Callable[[Any], str | None]) -> None:
        self.shape = shape
        self.problem = problem
        self.expected = shape.expected

    def accepts(self, value: Any) -> bool:
        return self.shape.accepts(value)

    def check(self, value: Any, where: str = "") -> None:
        self.shape.check(value, where)
        problem = self.problem(value)
        if problem:
            raise Mismatch(where, problem)


ANY = _Any()
NEVER = _Never()
STR = _Str()
BOOL = _Bool()
INT = _Int()
NUM = _Num()
FINITE = Finite()


class Either(Shape):
    def __init__(self, *options: Shape) -> None:
        self.options = options
        self.expected = " or ".join(o.expected for o in options)

    def check(self, value: Any, where: str = "") -> None:
        last: Mismatch | None = None
        for option in self.options:
            try:
                option.check(value, where)
                return
            except Mismatch as exc:
                last = exc
        if last is not None and any(o.accepts(value) for o in self.options):
            raise last  # the right type, a wrong value: say which
        raise Mismatch(where, f"expected {self.expected}, got {_type_name(value)}")


class Opt(Shape):
    """``shape`` or null."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.expected = f"{shape.expected} or null"

    def check(self, value: Any, where: str = "") -> None:
        if value is not None:
            self.shape.check(value, where)


class ListOf(Shape):
    """A list of ``item``s, at least ``min_items`` of them."""

    def __init__(self, item: Shape, min_items: int = 0) -> None:
        self.item = item
        self.min_items = min_items
        self.expected = "a list"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list)

    def check(self, value: Any, where: str = "") -> None:
        super().check(value, where)
        if len(value) < self.min_items:
            raise Mismatch(where, f"expected at least {self.min_items} items, got {len(value)}")
        for i, item in enumerate(value):
            self.item.check(item, f"{where}[{i}]")


class Pair(Shape):
    """A list of exactly two items: ``[first, second]`` (a label and its value)."""

    expected = "a pair"

    def __init__(self, first: Shape, second: Shape) -> None:
        self.first = first
        self.second = second

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) == 2

    def check(self, value: Any, where: str = "") -> None:
        if not isinstance(value, list):
            raise Mismatch(where, f"expected a pair, got {_type_name(value)}")
        if len(value) != 2:
            raise Mismatch(where, f"expected a pair, got {len(value)} items")
        self.first.check(value[0], f"{where}[0]")
        self.second.check(value[1], f"{where}[1]")


class MapOf(Shape):
    """An object whose keys are free (device names, process groups) and values of one shape."""

    def __init__(self, value: Shape) -> None:
        self.value = value
        self.expected = "an object"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, where: str = "") -> None:
        super().check(value, where)
        for key, item in value.items():
            self.value.check(item, _join(where, str(key)))


class Obj(Shape):
    """An object with ``required`` keys and ``optional`` ones (absent or null)."""

    expected = "an object"

    def __init__(self, required: Mapping[str, Shape] | None = None,
                 optional: Mapping[str, Shape] | None = None) -> None:
        self.required = dict(required or {})
        self.optional = dict(optional or {})

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, where: str = "") -> None:
        super().check(value, where)
        for key, shape in self.required.items():
            if key not in value:
                raise Mismatch(_join(where, key), "missing")
            shape.check(value[key], _join(where, key))
        for key, shape in self.optional.items():
            item = value.get(key)
            if item is not None:
                shape.check(item, _join(where, key))


class Tree(Shape):
    """A call tree: ``node`` describes each node (without its children), ``children`` names the
    key holding the list of child nodes. Checked with an explicit stack: a tree as deep as the
    JSON decoder allows does not recurse here."""

    expected = "an object"

    def __init__(self, node: Obj, children: str = "children") -> None:
        self.node = node
        self.children = children

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, where: str = "") -> None:
        # Each entry: (node, its parent's entry, its index there): the path of a node is built
        # only when it is wrong (building it for every node would cost depth x nodes).
        stack: list[tuple[Any, Any, int]] = [(value, None, -1)]
        while stack:
            entry = stack.pop()
            node = entry[0]
            try:
                self.node.check(node, "")
                kids = node.get(self.children)
                if kids is not None and not isinstance(kids, list):
                    raise Mismatch(self.children, f"expected a list, got {_type_name(kids)}")
            except Mismatch as exc:
                raise Mismatch(_join(self._path(entry, where), exc.where), exc.what) from None
            if kids:
                stack.extend((kid, entry, i) for i, kid in enumerate(kids))

    def _path(self, entry: tuple[Any, Any, int], where: str) -> str:
        steps: list[int] = []
        while entry[1] is not None:
            steps.append(entry[2])
            entry = entry[1]
        return where + "".join(f".{self.children}[{i}]" for i in reversed(steps)).lstrip(
            "." if not where else "")
