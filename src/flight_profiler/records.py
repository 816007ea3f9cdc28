"""Value classes for the modules every command to an agent imports, without ``dataclasses``.

``import dataclasses`` imports inspect, and with it ast, dis, tokenize and linecache: about a
tenth of a later command's start-up (issue 23, bench/bench_cli_startup.py). The few classes on
that path (AgentRequest, AnswerLimits, TargetInfo, Rendering) write their ``__init__`` and list
their ``FIELDS``; these bases give them what ``@dataclass`` gave: a repr, equality by fields
(same class only), and for the frozen ones no assignment after ``__init__`` and a hash.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any, ClassVar


class Record:
    """A mutable record: unhashable, as a ``@dataclass`` with ``eq=True`` is."""

    FIELDS: ClassVar[tuple[str, ...]] = ()
    __hash__ = None  # type: ignore[assignment]

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()


class FrozenRecord(Record):
    """An immutable record (``frozen=True``): ``__init__`` sets its fields with ``_set``."""

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())
