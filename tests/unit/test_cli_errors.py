"""One error printer, one way out: the exit status is the error's code, and a --json error
document carries that same code, whichever path (ours, click's, Ctrl-C, diagnose) ended the run."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from flight_profiler.cli.main import main
from flight_profiler.cli.output import print_error, run_cli
from flight_profiler.errors import (
    AttachFailed,
    ExitCode,
    FindingsThreshold,
    FlightProfilerError,
    already_traced,
    gdb_missing,
)

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str],
          group: click.Group | None = None) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        if group is None:
            main(argv)
        else:
            run_cli(group, argv)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _group(failure: BaseException) -> click.Group:
    """A one-command CLI whose command fails with ``failure`` (as a user's bad luck would)."""
    @click.group()
    def cli() -> None:
        pass

    @cli.command()
    @click.option("--json", "as_json", is_flag=True)
    def run(as_json: bool) -> None:
        raise failure

    return cli


@pytest.mark.parametrize("argv, code", [
    (["report", "/nonexistent/trace.json.gz", "--json"], ExitCode.BAD_INPUT_FILE),
    (["report", str(TRACES / "cpu_healthy.json.gz"), "--fail-on", "fatal", "--json"], ExitCode.USAGE),
    (["report", "--no-such-option", "--json"], ExitCode.USAGE),
    (["report", "--diff", "only-one.json", "--json"], ExitCode.USAGE),
])
def test_json_errors_carry_the_exit_status_of_the_process(
        argv: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    # WHEN the real CLI fails with --json
    status, out, err = _exit(argv, capsys)
    # THEN the process ends with the documented code and the error document says the same
    assert status == code
    doc = json.loads(out.strip().splitlines()[-1])["error"]
    assert doc["exit_code"] == status
    assert doc["message"] and err == ""


def test_a_click_error_that_is_no_usage_error_keeps_its_own_code(
        capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a click failure with exit code 1 (e.g. click.FileError), which once printed 2
    group = _group(click.FileError("out.md", "disk full"))
    status, out, _ = _exit(["run", "--json"], capsys, group)
    assert status == 1
    assert json.loads(out)["error"] == {"kind": "command_failed", "exit_code": 1, "hint": "",
                                        "message": "Could not open file 'out.md': disk full"}
    # AND without --json, click's own text, same code
    status, out, err = _exit(["run"], capsys, group)
    assert (status, out) == (1, "") and "disk full" in err


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_is_one_bare_line_and_130(as_json: bool, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _exit(["run"] + (["--json"] if as_json else []), capsys,
                             _group(KeyboardInterrupt()))
    # (click itself ends the ^C line with a newline first)
    assert (status, out, err.lstrip("\n")) == (ExitCode.INTERRUPTED, "", "interrupted\n")


@pytest.mark.parametrize("as_json", [False, True])
def test_a_verdict_the_command_reported_itself_only_sets_the_exit_status(
        as_json: bool, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN diagnose's way out: its summary (or JSON document) already said "exit 9"
    verdict = FindingsThreshold("findings reached --fail-on warning: exit 9", "", reported=True)
    status, out, err = _exit(["run"] + (["--json"] if as_json else []), capsys, _group(verdict))
    # THEN nothing more is printed (no second JSON document) and the code is the finding's
    assert (status, out, err) == (ExitCode.FINDINGS, "", "")


def test_the_printer_has_the_command_line_and_the_shell_forms(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = AttachFailed("cannot attach", "retry")
    print_error(err, as_json=False)
    assert capsys.readouterr().err == "error: cannot attach\nhint: retry\n"
    print_error(err, as_json=False, one_line=True)
    assert capsys.readouterr().err == "error: cannot attach (hint: retry)\n"
    print_error(err, as_json=True, one_line=True)  # JSON is JSON in the shell too
    assert json.loads(capsys.readouterr().out)["error"]["exit_code"] == ExitCode.ATTACH_FAILED


def test_an_error_text_met_in_several_places_is_built_once() -> None:
    from flight_profiler.attach.inject import choose_method

    traced = already_traced(1234, 99)
    assert (traced.message, traced.hint) == ("process 1234 is already traced by PID 99 (a debugger?)",
                                             "detach that tracer first (see `ps -p 99`)")
    # Whichever path finds gdb missing, the fix named is the same (and $FLIGHT_PROFILER_GDB works
    # for both: both look gdb up through attach.gdb.gdb_path).
    with pytest.raises(AttachFailed) as chosen:
        choose_method("gdb", cli_version=(3, 11), target_version=(3, 11), gdb_available=False,
                      remote_debug_disabled=False,
                      pyrasite_available=False, ptrace_supported=False)
    assert chosen.value.hint.startswith(gdb_missing("--method gdb").hint)
    assert isinstance(chosen.value, FlightProfilerError) and chosen.value.exit_code == 6


def test_every_exit_code_is_documented_once_and_summarised_in_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from flight_profiler.errors import EXIT_CODE_SUMMARIES

    codes = {v for k, v in vars(ExitCode).items() if k.isupper()}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "exit-codes.md").read_text()
    documented = {int(c) for c in re.findall(r"^\| (\d+) \| `[A-Z_]+` \|", doc, re.M)}
    assert codes == documented == set(EXIT_CODE_SUMMARIES)
    status, out, _ = _exit(["--help"], capsys)
    assert status == 0 and "12 diagnosis incomplete" in " ".join(out.split())


def test_a_subcommand_summary_is_one_text_for_the_listing_and_the_command() -> None:
    from flight_profiler.cli.app import cli
    from flight_profiler.cli.commands_table import SUBCOMMANDS

    with click.Context(cli) as ctx:
        for name, (_, summary) in SUBCOMMANDS.items():
            command = cli.get_command(ctx, name)
            assert command is not None and command.get_short_help_str(200) == summary


@pytest.mark.parametrize("attach", [[], ["attach"]], ids=["fast-path", "click-path"])
def test_a_stream_cancelled_by_ctrl_c_ends_130_through_the_hierarchy(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        attach: list[str]) -> None:
    import os

    closed: list[bool] = []

    class Session:
        def close(self) -> None:
            closed.append(True)

    # GIVEN a one-shot command whose stream the user cancelled (execute() said so on stderr)
    monkeypatch.setattr("flight_profiler.api.connect", lambda *a, **k: Session())
    monkeypatch.setattr("flight_profiler.cli.attach_cmd.execute", lambda *a, **k: False)
    monkeypatch.setattr("flight_profiler.cli.runner.execute", lambda *a, **k: False)
    status, out, err = _exit([*attach, str(os.getpid()), "--cmd", "stack", "--json"], capsys)
    # THEN exit 130, the session closed, and no second word about it (no JSON error either)
    assert (status, out, err, closed) == (ExitCode.INTERRUPTED, "", "", [True])
