"""A report (or a diff) with every text made safe to show: the one step every view takes first.

A report quotes its input files (paths, operator and kernel names, thread names, census
holders) and the findings built from them: all chosen by whoever wrote the file, perhaps the
target's user. Each view (terminal, Markdown, HTML, the diff's views) renders
``safe_copy(report)``: every string in it, dictionary keys included, passed through
:func:`flight_profiler.safe_text.safe_text`, so no view can forget a field. Numbers and the
structure are kept; the report itself is left as it was (its JSON form escapes on its own).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from flight_profiler.safe_text import safe_text

T = TypeVar("T")

# Names longer than this are cut (the views shorten them much more anyway).
TEXT_LIMIT = 8192
# The views read a few levels of a report's data; below this a loader's raw nesting is left
# as it is rather than walked (no view prints it).
MAX_DEPTH = 64


def safe_copy(value: T) -> T:
    """``value`` (a dataclass, dict, list, tuple, str, number) with every string made safe."""
    copied: T = _copy(value, 0)
    return copied


def _copy(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return safe_text(value, TEXT_LIMIT)
    if depth > MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {_copy(k, depth + 1): _copy(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy(v, depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _copy(getattr(value, f.name), depth + 1)
                   for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value
