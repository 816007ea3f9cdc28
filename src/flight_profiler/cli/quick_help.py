"""``flight_profiler``, ``--help``, ``-h`` and ``--version`` without importing click (issue 23:
click is about half of the CLI's start-up): the same text click prints, from the same data
(cli/commands_table.py), laid out as click's HelpFormatter does at its usual width (78
columns: a terminal of 80 or more, or none). On a narrower terminal ``render`` gives None and
click prints it. tests/unit/test_quick_help.py compares the two texts."""

from __future__ import annotations

import os
import sys
import textwrap

from flight_profiler import __version__
from flight_profiler.cli.commands_table import EPILOG, GROUP_HELP, OPTIONS, SUBCOMMANDS

WIDTH = 78  # click: min(terminal columns, 80) - 2
_USAGE = "Usage: flight_profiler [OPTIONS] COMMAND [ARGS]..."


def _columns() -> int:
    """shutil.get_terminal_size().columns, as click asks it, without importing shutil: $COLUMNS,
    else stdout's terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def _paragraphs(text: str, width: int, indent: str) -> str:
    """click's wrap_text(preserve_paragraphs=True): each paragraph refilled, keeping the extra
    indentation of its first line."""
    out = []
    for block in text.expandtabs().split("\n\n"):
        lines = [line for line in block.splitlines() if line]
        if not lines:
            continue
        extra = " " * (len(lines[0]) - len(lines[0].lstrip()))
        joined = " ".join(line.lstrip() if i == 0 else line for i, line in enumerate(lines))
        out.append(textwrap.fill(joined, width, initial_indent=indent + extra,
                                 subsequent_indent=indent + extra, replace_whitespace=False))
    return "\n\n".join(out)


def _definitions(rows: list[tuple[str, str]], width: int) -> list[str]:
    first = min(max(len(term) for term, _ in rows), 30) + 2
    lines = []
    for term, text in rows:
        wrapped = textwrap.fill(text, max(width - first - 2, 10), replace_whitespace=False).splitlines()
        lines.append(f"  {term}{' ' * (first - len(term))}{wrapped[0]}")
        lines.extend(" " * (first + 2) + rest for rest in wrapped[1:])
    return lines


def render() -> str | None:
    """The top-level help click would print, or None where click's layout differs (a terminal
    narrower than 80 columns)."""
    if _columns() < WIDTH + 2:
        return None
    commands = [(name, summary) for name, (_, summary) in SUBCOMMANDS.items()]
    return "\n".join([
        _USAGE, "", _paragraphs(GROUP_HELP, WIDTH, "  "), "", "Options:",
        *_definitions(OPTIONS, WIDTH), "", "Commands:", *_definitions(commands, WIDTH), "",
        _paragraphs(EPILOG, WIDTH, "  "),
    ]) + "\n"


def version() -> str:
    return f"flight_profiler, version {__version__}\n"
