"""The book of hooked functions: which function objects carry a wrapper of ours, the hooks on
each, and the code each ran before.

hooks.py writes it (install/remove), targets.py reads it (a function already hooked resolves to
its own code, not the wrapper), hook_codegen.py names its wrapper code after HOOK_FILE_PREFIX and
reads each :class:`Hook`'s callbacks. A leaf: it imports none of the three, so they form no
import cycle.
"""

from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

CodeType = types.CodeType
FunctionType = types.FunctionType
OnEnter = Callable[[tuple[Any, ...], Mapping[str, Any]], Any]
OnExit = Callable[[Any, Any, Optional[BaseException], int], None]

HOOK_FILE_PREFIX = "<flight_profiler hook"  # co_filename of every wrapper code we generate


class Hook:
    """One observer of one function (several may share a function).

    ``gate`` (optional, a ``hook_gate.Gate``): the same observer split into a filter the
    wrapper can run inline and the callbacks for the calls that pass it; ``on_enter`` and
    ``on_exit`` must still do everything themselves (filter included) for when it cannot.
    """

    __slots__ = ("active", "errors", "gate", "on_enter", "on_exit")

    def __init__(self, on_enter: OnEnter | None, on_exit: OnExit, gate: Any = None) -> None:
        self.on_enter = on_enter
        self.on_exit = on_exit
        self.gate = gate
        self.active = True
        self.errors = 0

    def count_error(self, exc: BaseException) -> None:
        """A callback raised ``exc`` on the target's thread and it was swallowed (shield.py)."""
        self.errors += 1


class Patch:
    """One hooked function (or nested code), its hooks, and everything needed to undo it."""

    def __init__(self, description: str, function: FunctionType, code: CodeType, nested: bool) -> None:
        self.description = description
        self.function = function  # whose __code__ is swapped (the OUTER function when nested)
        self.code = code  # the original code being observed
        self.nested = nested
        self.hooks: tuple[Hook, ...] = ()
        self.orig_function: FunctionType | None = None  # non-nested: what the wrapper calls
        self.wrapper: CodeType | None = None  # the wrapper currently installed
        self.outer_before: CodeType | None = None  # nested: outer body before patching
        self.live: list[weakref.ref[FunctionType]] = []
        self.broken = False  # someone else replaced our wrapper: leave theirs alone

    def qualname(self) -> str:
        qualname: str | None = getattr(self.code, "co_qualname", None)  # 3.11+
        return qualname or self.description.split(".", 1)[-1]


# Re-entrant: removing a hook rebuilds the wrapper, which reads original_code() under the lock.
lock = threading.RLock()
# (id(function),) for a function; (id(outer function), id(nested code)) for a nested target.
patches: dict[tuple[int, ...], Patch] = {}


def function_patch(function: FunctionType) -> Patch | None:
    return patches.get((id(function),))


def original_code(function: FunctionType) -> CodeType:
    """The code ``function`` runs when no hook of ours is in the way."""
    with lock:
        patch = function_patch(function)
        if patch is not None and patch.orig_function is not None:
            return patch.orig_function.__code__
        return function.__code__


def active() -> list[str]:
    """Descriptions of the functions currently hooked (for status and tests)."""
    with lock:
        return [p.description for p in patches.values()]
