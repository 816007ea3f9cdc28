"""The PID command and the shell: exit codes, one-line errors, JSON errors, help, no attach on
a malformed command."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from flight_profiler.cli.main import main
from flight_profiler.errors import ExitCode, FlightProfilerError, UsageError, from_remote

DEAD_PID = 4_194_000  # above the default pid_max range used here


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_dead_pid_exit_code_and_one_line(capsys) -> None:
    code, _out, err = run([str(DEAD_PID), "--cmd", "stack"], capsys)
    assert code == ExitCode.PROCESS_NOT_FOUND == 3
    assert err.splitlines()[0] == f"error: no process with pid {DEAD_PID}"
    assert err.splitlines()[1].startswith("hint: ") and len(err.splitlines()) == 2


def test_json_errors_go_to_stdout_as_one_document(capsys) -> None:
    code, out, err = run([str(DEAD_PID), "--cmd", "stack", "--json"], capsys)
    assert code == 3 and err == ""
    assert json.loads(out)["error"] == {
        "kind": "process_not_found", "message": f"no process with pid {DEAD_PID}",
        "hint": json.loads(out)["error"]["hint"], "exit_code": 3}


@pytest.mark.parametrize("command", ["stak", "stack --frobnicate", "stack --limit 0", "",
                                     'stack "open', "torch memroy"])
def test_malformed_command_exits_2_before_attaching(capsys, command: str) -> None:
    # our own pid: a malformed command must be rejected before anything touches the target
    code, _out, err = run([str(os.getpid()), "--cmd", command], capsys)
    assert code == ExitCode.USAGE
    assert err.startswith("error: ") and len(err.strip().splitlines()) <= 2
    assert not os.path.exists(f"/tmp/flight_profiler-{os.geteuid()}/agent-{os.getpid()}.sock")


def test_bad_global_options_exit_2(capsys) -> None:
    code, _, err = run([str(os.getpid()), "--method", "magic", "--cmd", "stack"], capsys)
    assert code == 2 and "magic" in err
    code, _, err = run([str(os.getpid()), "--timeout", "-1", "--cmd", "stack"], capsys)
    assert code == 2


def test_command_help_inside_cmd_exits_0(capsys) -> None:
    code, out, _ = run([str(DEAD_PID), "--cmd", "stack --help"], capsys)
    assert code == 0 and "--all" in out


def test_attach_help_lists_options(capsys) -> None:
    code, out, _ = run(["attach", "--help"], capsys)
    assert code == 0
    for option in ("--cmd", "--json", "--timeout", "--method", "--verbose"):
        assert option in out


def test_remote_error_kinds_map_to_exit_codes() -> None:
    assert from_remote({"kind": "usage", "message": "m"}).exit_code == 2
    assert from_remote({"kind": "not_found", "message": "m", "hint": "h"}).hint == "h"
    assert from_remote({"kind": "torch_missing", "message": "m"}).exit_code == 11
    assert from_remote({"kind": "weird", "message": "m"}).exit_code == 1
    assert from_remote({}).message == "the agent reported an error"


# -- shell -----------------------------------------------------------------------------------

class FakeSession:
    """What the shell sees of a session: execute() answers as the agent would."""

    def __init__(self) -> None:
        self.client: object | None = object()
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.pid = 1
        self.hello = {"python": "3.11.7", "agent_version": "0.1.0"}

    def execute(self, request: Any, on_event: Any = None, timeout: Any = None,
                on_cancel: Any = None, grace: float = 3.0) -> dict[str, Any]:
        self.sent.append((request.cmd, request.args))
        if request.cmd == "status":
            raise FlightProfilerError("agent says no")
        if request.cmd == "detach":
            self.client = None
            return {"detached": True, "hooks_removed": 0}
        return {"threads": [{"name": "MainThread", "main": True, "frames": [
            {"file": "train.py", "line": 3, "function": "train_step"}]}]}

    def close(self) -> None:
        self.client = None


def test_shell_runs_commands_survives_errors_and_quits(monkeypatch, capsys) -> None:
    from flight_profiler.cli import shell

    monkeypatch.setattr(shell, "HISTORY", os.devnull)
    lines = iter(["help", "help stack", "stak", "status", "stack --json-ish", "stack", "quit",
                  "stack"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    session = FakeSession()
    shell.run_shell(session)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert "torch memory" in out and "Python stacks of all threads" in out  # help
    assert "--limit" in out  # help stack
    assert "error: unknown command 'stak' (hint: known commands:" in err
    assert all(line.startswith("error: ") for line in err.splitlines())  # one line per error
    assert "error: agent says no" in err
    assert "error: stack: No such option" in err
    assert "train_step" in out  # the command after the errors still ran
    assert session.client is not None and [c for c, _ in session.sent] == ["status", "stack"]
    assert next(lines) == "stack"  # quit ended the loop


def test_shell_detach_ends_the_session_and_eof_quits(monkeypatch, capsys) -> None:
    from flight_profiler.cli import shell

    monkeypatch.setattr(shell, "HISTORY", os.devnull)
    lines = iter(["detach", "stack"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    session = FakeSession()
    shell.run_shell(session)  # type: ignore[arg-type]
    assert "detached" in capsys.readouterr().out
    assert next(lines) == "stack"

    def eof(prompt: str = "") -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    shell.run_shell(FakeSession())  # type: ignore[arg-type]  # returns instead of looping


@pytest.mark.parametrize("command", ["help", "torch", "torch --help", "help torch memory"])
def test_help_inside_cmd_prints_help_without_attaching(capsys, command: str) -> None:
    code, out, _err = run([str(os.getpid()), "--cmd", command], capsys)
    assert code == 0
    assert "torch memory" in out and ("Usage:" in out or "ommands" in out)
    assert not os.path.exists(f"/tmp/flight_profiler-{os.geteuid()}/agent-{os.getpid()}.sock")


def test_help_for_unknown_topic() -> None:
    from flight_profiler.requests import help_text

    with pytest.raises(FlightProfilerError, match="no command 'nope'"):
        help_text("nope")
    assert isinstance(UsageError("x"), FlightProfilerError)


def test_ctrl_c_during_a_stream_cancels_and_renders_the_final_result(capsys) -> None:
    from flight_profiler.cli.runner import execute
    from flight_profiler.client import RequestInterrupted
    from flight_profiler.requests import hooks

    class StreamingSession(FakeSession):
        def execute(self, request: Any, on_event: Any = None, timeout: Any = None,
                    on_cancel: Any = None, grace: float = 3.0) -> dict[str, Any]:
            on_event({"type": "call", "n": 1, "ts": 0, "thread": "MainThread", "cost_ms": 1.0,
                      "values": [["params", "(3,)"]]})
            on_cancel()  # what Session.execute does on Ctrl-C, before draining
            raise RequestInterrupted({"reason": "cancelled", "calls": 1, "matched": 1, "events": 1,
                               "elapsed_s": 0.5})

    # WHEN Ctrl-C stops a watch on its first call
    completed = execute(StreamingSession(), hooks.watch(["m", "f"]), as_json=False)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    # THEN the call and the agent's final answer are both shown, and the CLI exits 130
    assert completed is False
    assert "#1 MainThread" in out and "params = (3,)" in out
    assert "watch ended (cancelled)" in out
    assert "cancelling" in err


def test_exit_code_doc_lists_every_code() -> None:
    from support import REPO

    doc = (REPO / "docs" / "exit-codes.md").read_text()
    for name, value in vars(ExitCode).items():
        if not name.startswith("_"):
            assert f"| {value} | `{name}` |" in doc, name


def test_help_imports_neither_torch_nor_rich() -> None:
    import re
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "flight_profiler", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Usage" in proc.stdout
    modules = set(re.findall(r"\|\s+([\w.]+)\s*$", proc.stderr, re.M))
    assert "flight_profiler.cli.quick_help" in modules  # the CLI ran (--help needs no click)
    assert not {"torch", "rich", "numpy", "click"} & {m.split(".")[0] for m in modules}
