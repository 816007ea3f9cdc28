"""cli/plain_status.py: the status table a script gets without importing rich is, byte for byte,
the one rich prints, on every status where it prints at all; on the others rich prints."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
from rich.console import Console

from flight_profiler.cli import plain_status
from flight_profiler.cli.agent_commands.basic import render_status

BASE: dict[str, Any] = {
    "agent_version": "0.27.0", "uptime_s": 12.345, "pid": 4242,
    "python": {"version": "3.11.7", "executable": "/usr/bin/python3",
               "argv": ["train.py", "--lr", "0.1"]},
    "threads": {"total": 5, "agent": 2},
    "torch": {"imported": True, "version": "2.13.0+cpu", "cuda_available": False},
    "active_hooks": [],
}


def status(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for name in parents:
            node = node[name]
        node[last] = value
    return data


# (name, status, COLUMNS, printed plain?): plain ones are compared with rich byte for byte
CASES: list[tuple[str, dict[str, Any], int, bool]] = [
    ("typical", status(), 80, True),
    ("hooks on several lines", status(active_hooks=["watch m.f", "trace m.Model.step",
                                                     "torch memory record"]), 80, True),
    ("no torch", status(torch={}), 80, True),
    ("torch being imported", status(torch={"importing": True}), 100, True),
    ("cuda unknown, an error text", status(torch__cuda_available=None,
                                          torch__cuda_error="driver too old (535 < 550)"), 120, True),
    ("cuda available", status(torch__cuda_available=True), 80, True),
    ("no argv, numbers missing", status(python__argv=[], pid=None, uptime_s=None,
                                        threads={}), 80, True),
    ("numbers that are not", status(pid="4242x", uptime_s=float("nan"),
                                    threads={"total": True, "agent": 1.5}), 80, True),
    ("trailing and double spaces", status(python__argv=["a  b ", " c"]), 80, True),
    ("long argv that fits 200 columns", status(python__argv=["--flag"] * 20), 200, True),
    # rich's own layout: the plain writer declines, rich prints
    ("long argv wrapped by rich", status(python__argv=["--flag"] * 20), 80, False),
    ("wide characters", status(python__executable="/opt/\u30d7\u30ed\u30b8\u30a7\u30af\u30c8/python"), 80, False),
    ("accents", status(python__argv=["caf\u00e9.py"]), 80, False),
    ("markup in a value", status(python__argv=["[bold]x[/bold]"]), 80, False),
    ("an emoji code", status(python__argv=["--tag", ":smile:"]), 80, False),
    ("a control character", status(active_hooks=["watch m.\x1b[31mf"]), 80, False),
    ("a backslash", status(python__executable="C:\\python\\python.exe"), 80, False),
    ("armed triggers", status(arm=[{"id": 1}]), 80, False),
]


def rich_text(data: dict[str, Any], columns: int) -> str:
    """What the CLI's Console prints to a pipe with COLUMNS set."""
    out = io.StringIO()
    console = Console(file=out, _environ={"COLUMNS": str(columns)}, force_jupyter=False)
    try:
        render_status(data, console)
    except Exception as exc:  # the armed case: its trigger list is not this test's business
        return f"<rich: {type(exc).__name__}>"
    return out.getvalue()


@pytest.mark.parametrize(("data", "columns", "plain"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_plain_table_is_richs_or_none(data: dict[str, Any], columns: int, plain: bool) -> None:
    got = plain_status.render(data, out=io.StringIO(), environ={"COLUMNS": str(columns)})
    assert (got is not None) == plain
    if got is not None:
        assert got == rich_text(data, columns)


def test_the_width_limit_is_richs_to_the_column() -> None:
    """The widest table that fits is printed plain; one column narrower, rich wraps it."""
    data = status()
    text = plain_status.render(data, out=io.StringIO(), environ={"COLUMNS": "200"})
    assert text is not None
    width = max(len(line) for line in text.splitlines())
    exact = plain_status.render(data, out=io.StringIO(), environ={"COLUMNS": str(width)})
    assert exact == text == rich_text(data, width)
    assert plain_status.render(data, out=io.StringIO(), environ={"COLUMNS": str(width - 1)}) is None
    assert rich_text(data, width - 1) != text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("environ", [{"COLUMNS": "80", "FORCE_COLOR": "1"},
                                     {"COLUMNS": "80", "TTY_COMPATIBLE": "1"},
                                     {"COLUMNS": "0"}])
def test_rich_prints_what_rich_would_style_or_size_itself(environ: dict[str, str]) -> None:
    assert plain_status.render(status(), out=io.StringIO(), environ=environ) is None


def test_a_terminal_gets_rich() -> None:
    assert plain_status.render(status(), out=_Tty(), environ={"COLUMNS": "80"}) is None
