"""Bad CLI input is a usage error (exit 2) with one clear line: never a traceback, never an
endless run, and never a touch of the target (the pid here is this test process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from flight_profiler.cli.main import main
from flight_profiler.errors import ExitCode

PID = str(os.getpid())  # a live Python process: a bug would try to attach to it


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize("argv", [
    [PID, "--timeout", "nan", "--cmd", "stack"],
    [PID, "--timeout", "inf", "--cmd", "stack"],
    [PID, "--cmd", "watch __main__ f --timeout nan"],
    [PID, "--cmd", "watch __main__ f --timeout inf"],
    [PID, "--cmd", "trace __main__ f -i nan"],
    [PID, "--cmd", "trace __main__ f -i inf"],
    [PID, "--cmd", "trace __main__ f --timeout inf"],
    [PID, "--cmd", "torch profile __main__ f --timeout nan"],
    ["diagnose", PID, "__main__", "f", "--timeout", "nan"],
])
def test_non_finite_numbers_are_usage_errors(argv, capsys, monkeypatch) -> None:
    monkeypatch.setattr("flight_profiler.api.connect", _no_attach)
    code, out, err = run(argv, capsys)
    assert code == ExitCode.USAGE, (out, err)
    assert "Traceback" not in out + err and ("nan" in err or "inf" in err)


def _no_attach(*_a: object, **_k: object) -> None:
    raise AssertionError("bad input must be refused before attaching")


@pytest.mark.parametrize(("command", "why"), [
    ("watch __main__ f --expr " + "(" * 100_000 + ")" * 100_000, "characters"),
    ("watch __main__ f --expr " + "(" * 2000 + "1" + ")" * 2000, "nested"),
    ("watch __main__ f -f " + "-" * 3000 + "1", "nested"),
    ("trace __main__ f -f " + "[" * 1000 + "]" * 1000, "nested"),
    ("watch __main__ f --expr " + ",".join(["x"] * 40_000), "characters"),
    ("watch __main__ f --expr " + ",".join(["x"] * 65), "expressions"),
    ("watch __main__ f --expr '" + "x" * (10 * 1024 * 1024) + "'", "characters"),
])
def test_huge_and_deep_expressions_are_refused_quickly(command, why, capsys, monkeypatch) -> None:
    monkeypatch.setattr("flight_profiler.api.connect", _no_attach)
    start = time.monotonic()
    code, _out, err = run([PID, "--cmd", command], capsys)
    assert time.monotonic() - start < 15.0  # was: MemoryError / quadratic quoting, minutes
    assert code == ExitCode.USAGE and why in err and "Traceback" not in err
    assert len(err.splitlines()) == 2  # error line + hint line


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130() -> None:
    # GIVEN a CLI interrupted while it is still importing (before click even parsed anything)
    # (deterministic: the interrupt is raised from inside the lazy import itself; a SIGINT
    # during the interpreter's own start-up, before any of our code, stays Python's)
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def interrupted(name, *a, **k):\n"
            "    if name == 'flight_profiler.cli.app':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = interrupted\n"
            "from flight_profiler.cli.main import main\n"
            "main(['status'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED == 130
    assert proc.stderr == "interrupted\n"
