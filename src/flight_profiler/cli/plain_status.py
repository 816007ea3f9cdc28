"""``status``'s table as plain text, for a script: the bytes rich prints, without importing rich.

A later ``flight_profiler PID --cmd status`` spent more than half its time importing rich to
print nine rows (issue 23). What rich prints there is simple when the output is not a terminal
(no styles) and every cell is plain: each row is the label padded to the widest label, two
spaces, and the value padded to the widest value. :func:`render` writes that, and only that:
anything rich would treat otherwise gives None and the caller lets rich print it. So:

- the output is a terminal, or rich was told to treat it as one (FORCE_COLOR, TTY_COMPATIBLE):
  styles, the terminal's own width;
- a cell outside printable ASCII (wide and combining characters: rich's cell widths), or with
  ``[`` or ``\\`` (markup and its escapes) or ``:`` (rich turns ``:name:`` into an emoji);
- the table is wider than the console (rich wraps and shrinks columns) or COLUMNS is 0;
- the status has armed triggers (a second table of their own).

The width is rich's: COLUMNS when it is a number, else the first of stdin, stdout and stderr
that is a terminal, else 80. tests/unit/test_plain_status.py compares both on many statuses.
"""

from __future__ import annotations

import os
import sys

from flight_profiler.cli.agent_commands.base import fmt
from flight_profiler.cli.agent_commands.basic import status_rows
from flight_profiler.safe_text import DEFAULT_LIMIT, safe_text

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TextIO

_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - frozenset("[\\:")


def _text(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    return safe_text(value, limit)


def _number(value: object, spec: str) -> str:
    return fmt(value, spec, text=_text)


def console_width(environ: Mapping[str, str]) -> int | None:
    """The width rich's Console takes here (None: COLUMNS=0, which rich takes as is)."""
    columns = environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns) or None
    width = 0
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd)[0]
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def plain_output(out: TextIO, environ: Mapping[str, str]) -> bool:
    """Would rich print to ``out`` without styles (not a terminal, not forced to be one)?"""
    if os.name == "nt" or "FORCE_COLOR" in environ or "TTY_COMPATIBLE" in environ:
        return False
    try:
        return not out.isatty()
    except (AttributeError, ValueError):
        return False


def table(rows: list[tuple[str, str]], width: int) -> str | None:
    """Rich's ``Table(show_header=False, box=None, pad_edge=False)`` of two columns, as text,
    when every cell is plain and it fits ``width``; else None."""
    cells = [(label, value.split("\n")) for label, value in rows]
    texts = [label for label, _ in cells] + [line for _, lines in cells for line in lines]
    if not all(_PLAIN.issuperset(t) for t in texts):
        return None
    left = max(len(label) for label, _ in cells)
    right = max(len(line) for _, lines in cells for line in lines)
    if not left or not right or left + 2 + right > width:
        return None
    out = []
    for label, lines in cells:
        for i, line in enumerate(lines):
            out.append(f"{label if i == 0 else '':<{left}}  {line:<{right}}\n")
    return "".join(out)


def render(data: dict[str, Any], out: TextIO | None = None,
           environ: Mapping[str, str] | None = None) -> str | None:
    """The status table as rich would print it to ``out`` (stdout), or None: let rich print."""
    environ = os.environ if environ is None else environ
    if data.get("arm") or not plain_output(out or sys.stdout, environ):
        return None
    width = console_width(environ)
    if width is None:
        return None
    return table(status_rows(data, _text, _number), width)
