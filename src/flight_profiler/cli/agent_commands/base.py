"""How the CLI shows an agent command's answers: renderers by the request's handler name.

Renderers get an answer that already passed its handler's shape (flight_profiler.answers: the
types of the fields they read are known, optional ones may be absent or null), and everything
they print that came from the target goes through :func:`txt` (or ``safe_text`` where no rich
markup is involved): a thread name, a repr or a file name shows its control characters as
``\\x1b`` and cannot drive the terminal or break rich's markup.
"""

from __future__ import annotations

import json

from flight_profiler.records import Record
from flight_profiler.safe_text import DEFAULT_LIMIT, safe_markup

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from typing import Any, Callable

    from rich.console import Console

    # Renderers get the JSON data the agent sent and a console to print on (human output
    # only; with --json the CLI prints the data itself).
    Renderer = Callable[[dict[str, Any], Console], None]



def txt(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """``value`` (from the target) as text for a rich markup string: made safe, then escaped."""
    return safe_markup(value, limit)


def fmt(value: object, spec: str, default: str = "?", text: Callable[..., str] = txt) -> str:
    """A number from the agent formatted with ``spec``; ``default`` when it is not one, and
    ``text(value, 40)`` when it is something else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default if value is None else text(value, 40)
    try:
        return format(value, spec)
    except (ValueError, OverflowError):  # e.g. a NaN given to an integer format
        return text(value, 40)


def render_json(data: dict[str, Any], console: Console) -> None:
    # JSON escapes every control character (\u001b): nothing raw reaches the terminal
    console.print(json.dumps(data, default=str, indent=2), markup=False, highlight=False,
                  soft_wrap=True)


class Rendering(Record):
    FIELDS = ("result", "event")

    def __init__(self, result: Renderer = render_json, event: Renderer | None = None) -> None:
        self.result = result
        self.event = event  # set for streaming commands
