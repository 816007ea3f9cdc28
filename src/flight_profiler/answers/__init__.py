"""What the CLI accepts of an agent's answers: the shapes of each handler's result and events,
checked once where an answer enters (``api.Session``), before anything renders or uses it.

``check_result(cmd, data)`` / ``check_event(cmd, data)`` raise :class:`errors.BadAnswer`
("the agent's answer was malformed: stack: threads[0].frames[2].file: missing"). A handler this
CLI does not know (the API's raw requests) is only required to answer with an object.
"""

from __future__ import annotations

from flight_profiler.answers.schemas import ANSWERS
from flight_profiler.answers.shapes import ANY, Mismatch, Obj, Shape
from flight_profiler.errors import BadAnswer, malformed

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

_OBJECT = Obj()


def _check(shape: Shape, value: Any, what: str) -> None:
    try:
        _OBJECT.check(value)  # every result and event is an object, whatever its handler
        shape.check(value)
    except Mismatch as exc:
        raise malformed(f"{what}: {exc}") from None


def check_result(cmd: str, data: Any) -> None:
    """Raise BadAnswer unless ``data`` is a result ``cmd``'s renderers and consumers can use."""
    _check(ANSWERS.get(cmd, (ANY, ANY))[0], data, cmd)


def check_event(cmd: str, data: Any) -> None:
    """Raise BadAnswer unless ``data`` is an event of ``cmd``'s stream."""
    _check(ANSWERS.get(cmd, (ANY, ANY))[1], data, f"{cmd} event")


__all__ = ["BadAnswer", "check_event", "check_result"]
