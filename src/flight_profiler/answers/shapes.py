"""A small typed description of JSON shapes, checked once where an agent's answer enters the CLI.

The agent lives in a process another user controls and may be a fake: its answers are checked
against these shapes before anything renders or uses them, so that a string where a number was
expected, a frame without ``file`` or an integer of a thousand digits becomes one line ("the
agent's answer was malformed: stack: threads[0].frames[2].file: missing") instead of a traceback
somewhere in a renderer. Every check is iterative or bounded in depth (a nested answer cannot
exhaust the stack) and linear in the answer's size; the path to a wrong value is built only
when there is one (a watch event costs tens of microseconds, a 20,000-node call tree a
fraction of a second).

Objects accept keys they do not describe (a newer agent may add some); a described key must have
its type. ``None`` is accepted wherever a key is optional.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

# Integers the agent sends are counts, sizes, ids, timestamps: 2**64 covers them all. A bigger
# one (a thousand digits) costs quadratic time to format and overflows float().
MAX_INT = 1 << 64


class Mismatch(Exception):
    """``what`` is wrong at ``where`` (``threads[0].frames[2].file``). The path is collected
    step by step while the exception leaves the containers (innermost step first)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.steps: list[str] = []

    def at(self, step: str) -> Mismatch:
        self.steps.append(step)
        return self

    @property
    def where(self) -> str:
        return "".join(reversed(self.steps)).lstrip(".")

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" if self.steps else self.what


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


class Shape:
    """What a value must be. ``check`` raises :class:`Mismatch`."""

    expected = "a value"

    def check(self, value: Any) -> None:
        if not self.accepts(value):
            raise self.wrong(value)

    def accepts(self, value: Any) -> bool:
        """The value has the right type (its content may still be wrong)."""
        return True

    def wrong(self, value: Any) -> Mismatch:
        return Mismatch(f"expected {self.expected}, got {_type_name(value)}")


class _Any(Shape):
    expected = "any value"

    def check(self, value: Any) -> None:
        pass


class _Type(Shape):
    """Exactly one JSON type (``bool`` is not an ``int`` here)."""

    def __init__(self, kind: type, expected: str) -> None:
        self.kind = kind
        self.expected = expected

    def accepts(self, value: Any) -> bool:
        return type(value) is self.kind

    def check(self, value: Any) -> None:
        if type(value) is not self.kind:
            raise self.wrong(value)


class _Int(Shape):
    expected = "an integer"

    def accepts(self, value: Any) -> bool:
        return type(value) is int

    def check(self, value: Any) -> None:
        if type(value) is not int:
            raise self.wrong(value)
        if not -MAX_INT <= value <= MAX_INT:
            raise Mismatch("an integer out of range")


class _Num(Shape):
    """An int or a float; NaN and infinities are numbers too (a gradient norm may be NaN)."""

    expected = "a number"
    finite = False

    def accepts(self, value: Any) -> bool:
        return type(value) in (int, float)

    def check(self, value: Any) -> None:
        kind = type(value)
        if kind is float:
            if self.finite and not math.isfinite(value):
                raise Mismatch(f"expected a finite number, got {value}")
        elif kind is int:
            if not -MAX_INT <= value <= MAX_INT:
                raise Mismatch("an integer out of range")
        else:
            raise self.wrong(value)


class _Finite(_Num):
    """A number that is neither NaN nor infinite (a duration, a size)."""

    expected = "a finite number"
    finite = True


class _Never(Shape):
    """Nothing is accepted: e.g. the events of a command that streams none."""

    expected = "nothing"

    def accepts(self, value: Any) -> bool:
        return False

    def check(self, value: Any) -> None:
        raise Mismatch("this command sends no events")


ANY = _Any()
NEVER = _Never()
STR = _Type(str, "a string")
BOOL = _Type(bool, "a boolean")
INT = _Int()
NUM = _Num()
FINITE = _Finite()


class Rule(Shape):
    """``shape``, then ``problem(value)`` (None when the value is right): a relation between
    fields that a shape cannot say (e.g. every measurement covers every model)."""

    def __init__(self, shape: Shape, problem: Callable[[Any], str | None]) -> None:
        self.shape = shape
        self.problem = problem
        self.expected = shape.expected

    def accepts(self, value: Any) -> bool:
        return self.shape.accepts(value)

    def check(self, value: Any) -> None:
        self.shape.check(value)
        problem = self.problem(value)
        if problem:
            raise Mismatch(problem)


class Either(Shape):
    def __init__(self, *options: Shape) -> None:
        self.options = options
        self.expected = " or ".join(o.expected for o in options)

    def accepts(self, value: Any) -> bool:
        return any(option.accepts(value) for option in self.options)

    def check(self, value: Any) -> None:
        # the first option of the value's type decides (no exception on the common path)
        for option in self.options:
            if option.accepts(value):
                option.check(value)
                return
        raise self.wrong(value)


class Opt(Shape):
    """``shape`` or null."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.expected = f"{shape.expected} or null"

    def accepts(self, value: Any) -> bool:
        return value is None or self.shape.accepts(value)

    def check(self, value: Any) -> None:
        if value is not None:
            self.shape.check(value)


class ListOf(Shape):
    """A list of ``item``s, at least ``min_items`` of them."""

    expected = "a list"

    def __init__(self, item: Shape, min_items: int = 0) -> None:
        self.item = item
        self.min_items = min_items

    def accepts(self, value: Any) -> bool:
        return type(value) is list

    def check(self, value: Any) -> None:
        if type(value) is not list:
            raise self.wrong(value)
        if len(value) < self.min_items:
            raise Mismatch(f"expected at least {self.min_items} items, got {len(value)}")
        if self.item is ANY:
            return
        check = self.item.check
        i = 0
        try:
            for i, item in enumerate(value):  # noqa: B007 (i names the wrong item)
                check(item)
        except Mismatch as exc:
            raise exc.at(f"[{i}]") from None


class Pair(Shape):
    """A list of exactly two items: ``[first, second]`` (a label and its value)."""

    expected = "a pair"

    def __init__(self, first: Shape, second: Shape) -> None:
        self.first = first
        self.second = second

    def accepts(self, value: Any) -> bool:
        return type(value) is list and len(value) == 2

    def check(self, value: Any) -> None:
        if type(value) is not list:
            raise self.wrong(value)
        if len(value) != 2:
            raise Mismatch(f"expected a pair, got {len(value)} items")
        for i, shape in enumerate((self.first, self.second)):
            try:
                shape.check(value[i])
            except Mismatch as exc:
                raise exc.at(f"[{i}]") from None


class MapOf(Shape):
    """An object whose keys are free (device names, process groups) and values of one shape."""

    expected = "an object"

    def __init__(self, value: Shape) -> None:
        self.value = value

    def accepts(self, value: Any) -> bool:
        return type(value) is dict

    def check(self, value: Any) -> None:
        if type(value) is not dict:
            raise self.wrong(value)
        key = ""
        try:
            for key, item in value.items():  # noqa: B007 (key names the wrong value)
                self.value.check(item)
        except Mismatch as exc:
            raise exc.at(f".{key}") from None


class Obj(Shape):
    """An object with ``required`` keys and ``optional`` ones (absent or null)."""

    expected = "an object"

    def __init__(self, required: Mapping[str, Shape] | None = None,
                 optional: Mapping[str, Shape] | None = None) -> None:
        self.required = tuple((required or {}).items())
        self.optional = tuple((optional or {}).items())

    def accepts(self, value: Any) -> bool:
        return type(value) is dict

    def check(self, value: Any) -> None:
        if type(value) is not dict:
            raise self.wrong(value)
        key = ""
        try:
            for key, shape in self.required:
                if key not in value:
                    raise Mismatch("missing")
                shape.check(value[key])
            for key, shape in self.optional:
                item = value.get(key)
                if item is not None:
                    shape.check(item)
        except Mismatch as exc:
            raise exc.at(f".{key}") from None


class Tree(Shape):
    """A call tree: ``node`` describes each node (without its children), ``children`` names the
    key holding the list of child nodes. Checked with an explicit stack: a tree as deep as the
    JSON decoder allows does not recurse here."""

    expected = "an object"

    def __init__(self, node: Obj, children: str = "children") -> None:
        self.node = node
        self.children = children

    def accepts(self, value: Any) -> bool:
        return type(value) is dict

    def check(self, value: Any) -> None:
        # Each entry: (node, its parent's entry, its index there): a node's path is built only
        # when it is wrong (building it for every node would cost depth x nodes).
        stack: list[tuple[Any, Any, int]] = [(value, None, -1)]
        check, children = self.node.check, self.children
        while stack:
            entry = stack.pop()
            node = entry[0]
            try:
                check(node)
                kids = node.get(children)
                if kids is not None and type(kids) is not list:
                    raise Mismatch(f"expected a list, got {_type_name(kids)}").at(f".{children}")
            except Mismatch as exc:
                while entry[1] is not None:
                    exc.at(f".{children}[{entry[2]}]")
                    entry = entry[1]
                raise
            if kids:
                stack.extend((kid, entry, i) for i, kid in enumerate(kids))
