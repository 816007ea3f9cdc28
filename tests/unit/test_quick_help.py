"""The top-level help without click (cli/quick_help.py) is click's own text, at every width."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from flight_profiler.cli import quick_help
from flight_profiler.cli.app import cli


def _click_help() -> str:
    with click.Context(cli, info_name="flight_profiler", **cli.context_settings) as ctx:
        return ctx.get_help() + "\n"


@pytest.mark.parametrize("columns", ["80", "81", "120", "400"])
def test_quick_help_is_clicks_help(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    assert quick_help.render() == _click_help()


@pytest.mark.parametrize("columns", ["79", "60", "20"])
def test_a_narrow_terminal_is_left_to_click(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    assert quick_help.render() is None
    assert "Usage: flight_profiler" in _click_help()


@pytest.mark.parametrize("argv,code", [(["--help"], 0), (["-h"], 0), ([], 2), (["--version"], 0)])
def test_the_console_script_answers_without_importing_click(argv, code):
    probe = ("import sys, runpy; sys.argv = ['flight_profiler', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('flight_profiler', run_name='__main__')\n"
             "finally:\n    print('CLICK' if 'click' in sys.modules else 'NO-CLICK', file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert out.returncode == code and out.stderr.strip() == "NO-CLICK"
    if argv == ["--version"]:
        assert out.stdout == f"flight_profiler, version {quick_help.__version__}\n"
    else:
        assert out.stdout.startswith("Usage: flight_profiler [OPTIONS] COMMAND [ARGS]...\n")
        assert "  ps        List Python processes to attach to" in out.stdout
