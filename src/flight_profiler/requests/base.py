"""What one agent command is, once its words are understood: the handler to run, its JSON
arguments, and the command line a user would type for it (shown in reports, re-runnable)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from flight_profiler.method_spec import split_method_words
from flight_profiler.records import FrozenRecord

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any


class AgentRequest(FrozenRecord):
    """One request, frozen (a value: compared by its fields; records.py says why it is not a
    dataclass)."""

    FIELDS = ("cmd", "args", "line")
    cmd: str  # the agent's handler name (agent registry.HANDLERS)
    args: dict[str, Any]
    # What a user types after --cmd for the same request: parse(line) gives it back.
    line: str

    def __init__(self, cmd: str, args: dict[str, Any] | None = None, line: str = "") -> None:
        self._set("cmd", cmd)
        self._set("args", {} if args is None else args)
        self._set("line", line)


def target_args(words: Sequence[str], nested: str | None = None) -> dict[str, Any]:
    """``module [class] method`` as typed -> the ``target`` argument every hooking command sends.

    Accepted: ``mod func``, ``mod Class meth`` and ``mod Class.meth``; ``nested`` (``-nm``) names a
    function defined inside ``method``.
    """
    module, cls, method = split_method_words(words)
    return {"module": module, "class": cls, "method": method, "nested": nested}


def number(value: float) -> str:
    """A number as short as it can be written and still read back exactly."""
    short = f"{value:g}"
    return short if float(short) == float(value) else repr(float(value))


class Line:
    """Builds the command line of a request, word by word, quoted as a shell would need."""

    def __init__(self, name: str, *words: str) -> None:
        self.words = [*name.split(), *words]

    def option(self, flag: str, value: Any) -> Line:
        """``flag value`` unless ``value`` is None; numbers written short, text quoted."""
        if value is None:
            return self
        if isinstance(value, bool):
            raise TypeError(f"{flag}: use flag() for booleans")
        self.words += [flag, number(value) if isinstance(value, float) else str(value)]
        return self

    def extend(self, *words: str) -> Line:
        self.words += words
        return self

    def flag(self, flag: str, on: bool | None) -> Line:
        if on:
            self.words.append(flag)
        return self

    def __str__(self) -> str:
        return shlex.join(self.words)
