"""`flight_profiler PID --cmd "status"` without click (cli/fast_cmd.py, issue 23): the same
request, output and exit code as the click path (`flight_profiler attach PID ...`), any other
shape left to click, and a later command importing neither click, rich (with --json), typing,
dataclasses, msgspec, the report engine nor an injector.

The target runs a real agent it started itself (agent/server.py: the same server an attach
loads), so that no ptrace is needed here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flight_profiler.cli import fast_cmd
from flight_profiler.requests import grammar
from support import REPO, Target, spawn

# Runs the console script's main() here, then writes what it printed, its exit code and the
# names of the modules it imported (minus those `python -c pass` has) to the file argv[1].
PROBE = r"""
import io, json, sys
out = sys.argv[1]
before = set(sys.modules)
sys.argv = ["flight_profiler", *sys.argv[2:]]
stdout, stderr = io.StringIO(), io.StringIO()
sys.stdout, sys.stderr = stdout, stderr
code = 0
try:
    from flight_profiler.cli.main import main
    main()
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
with open(out, "w") as fh:
    json.dump({"code": code, "out": stdout.getvalue(), "err": stderr.getvalue(),
               "modules": sorted(set(sys.modules) - before)}, fh)
"""

# A target whose own code starts the agent server (what the bootstrap does after an attach).
AGENT_TARGET = """
import os, sys, time
sys.path.insert(0, {src!r})
from flight_profiler.agent import server
server.start({{}})
print("READY", flush=True)
while True:
    time.sleep(0.05)
"""

# What a later command must never import (bench/bench_cli_startup.py measures each)...
NEVER = ("click", "msgspec", "torch", "numpy", "flight_profiler.report.engine", "flight_profiler.render", "flight_profiler.diagnose",
         "flight_profiler.attach.inject", "flight_profiler.attach.ptrace_inject",
         "flight_profiler.attach.gdb", "flight_profiler.requests.grammar",
         "flight_profiler.requests.commands")
# ... and, with --json, not these either (rich imports them all to draw a table).
LEAN = ("rich", "typing", "dataclasses", "inspect")


@pytest.fixture(scope="module")
def agent_target() -> Iterator[Target]:
    target = spawn(AGENT_TARGET.format(src=str(REPO / "src")))
    try:
        yield target
    finally:
        target.stop()


def run_cli(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / f"probe-{len(list(tmp_path.iterdir()))}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "_FLIGHT_PROFILER_COMPLETE")}
    env["COLUMNS"] = "100"  # rich's table width, the same for both paths
    done = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert out.exists(), done
    result: dict[str, object] = json.loads(out.read_text())
    return result


def _steady(text: object) -> str:
    # the agent's uptime moves between two runs; nothing else in these answers does
    text = re.sub(r'"uptime_s": [0-9.e+-]+', '"uptime_s": 0', str(text))
    return re.sub(r"\(up [0-9.]+s\)", "(up 0s)", text)


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


# -- the quick commands are the grammar's --------------------------------------------------------
@pytest.mark.parametrize("words", sorted(fast_cmd.QUICK))
def test_each_quick_command_builds_the_request_the_grammar_builds(words: tuple[str, ...]) -> None:
    line = " ".join(words)
    assert fast_cmd.quick_request(line) == grammar.parse(line)


def test_a_plain_shape_is_planned_as_attach_would_run_it() -> None:
    planned = fast_cmd.plan(["42", "--json", "-c", "stack --all", "--timeout", "2.5",
                             "--deadline", ".5"])
    assert planned is not None
    assert (planned.pid, planned.as_json, planned.timeout, planned.deadline) == (42, True, 2.5, 0.5)
    assert planned.request == grammar.parse("stack --all")
    defaults = fast_cmd.plan(["42", "--cmd", "status"])
    assert defaults is not None and (defaults.as_json, defaults.timeout, defaults.deadline) == (
        False, 10.0, None)


@pytest.mark.parametrize("args", [
    ["42"],                                         # the shell
    ["42", "--cmd=status"],                         # click's own spellings
    ["42", "-cstatus"],
    ["42", "--cmd", "status", "--json", "--json"],  # repeated
    ["42", "--cmd", "status", "--cmd", "stack"],
    ["42", "--cmd", "status", "--method", "gdb"],   # another option of attach
    ["42", "--cmd", "status", "-v"],
    ["42", "--cmd", "status", "--all-ranks"],
    ["42", "--cmd", "status", "--timeout"],         # a value missing
    ["42", "--cmd", "status", "--timeout", "1e3"],  # numbers click reads its way
    ["42", "--cmd", "status", "--timeout", "1_0"],
    ["42", "--cmd", "status", "--timeout", "nan"],
    ["42", "--cmd", "status", "--timeout", "0.05"],  # out of range: click's message
    ["42", "--cmd", "status", "--deadline", "-1"],
    ["42", "--cmd", "status", "--deadline", "90000"],
    ["42", "--cmd", "stack --limit 5"],             # a command with options: the grammar's
    ["42", "--cmd", "stack --all-ranks"],
    ["42", "--cmd", "'status'"],
    ["42", "--cmd", "help"],
    ["42", "--cmd", "--json"],
    ["4\u0662", "--cmd", "status"],                 # not ASCII digits
    ["attach", "42", "--cmd", "status"],
])
def test_any_other_shape_is_left_to_click(args: list[str]) -> None:
    assert fast_cmd.plan(args) is None


# -- both paths, side by side, on real processes -------------------------------------------------
CASES = [
    ["--cmd", "status"],
    ["--cmd", "status", "--json"],
    ["-c", "stack --all", "--json", "--timeout", "5"],
    ["--cmd", "torch fr"],               # an error from the agent: torch not imported there
    ["--cmd", "torch fr", "--json"],
    ["--cmd", "status", "--deadline", "30", "--json"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_the_fast_path_prints_and_exits_as_the_click_path(
        tmp_path: Path, agent_target: Target, args: list[str]) -> None:
    pid = str(agent_target.pid)
    fast = run_cli(tmp_path, pid, *args)
    slow = run_cli(tmp_path, "attach", pid, *args)
    assert "click" not in fast["modules"] and "click" in slow["modules"]  # two paths indeed
    if any(a.startswith("stack") for a in args):  # the agent's own threads move between two runs: compare the shape
        fast_doc, slow_doc = json.loads(str(fast["out"])), json.loads(str(slow["out"]))
        assert (fast["code"], sorted(fast_doc), fast["err"]) == (slow["code"], sorted(slow_doc),
                                                                  slow["err"])
        assert "MainThread" in str(fast_doc) and "MainThread" in str(slow_doc)
        return
    assert (fast["code"], _steady(fast["out"]), fast["err"]) == (
        slow["code"], _steady(slow["out"]), slow["err"])
    assert fast["out"] or fast["err"]


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["text", "json"])
def test_a_dead_pid_gets_the_same_error_on_both_paths(tmp_path: Path, extra: list[str]) -> None:
    pid = str(_dead_pid())
    fast = run_cli(tmp_path, pid, "--cmd", "status", *extra)
    slow = run_cli(tmp_path, "attach", pid, "--cmd", "status", *extra)
    assert "click" not in fast["modules"]
    assert fast["code"] == slow["code"] != 0
    assert (fast["out"], fast["err"]) == (slow["out"], slow["err"])
    assert pid in str(fast["out"]) + str(fast["err"])


@pytest.mark.parametrize("args", [["--cmd", "nosuch"], ["--cmd", "status", "--timeout", "0"],
                                  ["--cmd", "stack --limit 0", "--json"]])
def test_what_the_fast_path_leaves_to_click_still_gets_clicks_answer(
        tmp_path: Path, args: list[str]) -> None:
    pid = str(_dead_pid())
    got = run_cli(tmp_path, pid, *args)
    assert "click" in got["modules"] and got["code"] == 2  # usage errors, before any attach
    assert "Usage" in str(got["err"]) or "error" in str(got["out"]) + str(got["err"])


# -- the guard: what a later command costs ----------------------------------------------------
def test_a_later_status_json_imports_no_click_rich_typing_msgspec_engine_or_injector(
        tmp_path: Path, agent_target: Target) -> None:
    got = run_cli(tmp_path, str(agent_target.pid), "--cmd", "status", "--json")
    assert got["code"] == 0 and json.loads(str(got["out"]))["pid"] == agent_target.pid
    modules = set(got["modules"])  # type: ignore[call-overload]
    heavy = sorted(m for m in modules if any(m == n or m.startswith(n + ".")
                                             for n in (*NEVER, *LEAN)))
    assert heavy == []


def test_a_later_status_table_for_a_script_imports_no_rich_click_or_the_grammar(
        tmp_path: Path, agent_target: Target) -> None:
    """Printed to a pipe, the table is plain text (cli/plain_status.py): the bytes rich prints
    (test_the_fast_path_prints_and_exits_as_the_click_path compares them), without rich's
    import, most of what the command cost (issue 23). On main it imported rich.table."""
    got = run_cli(tmp_path, str(agent_target.pid), "--cmd", "status")
    assert got["code"] == 0 and "instrumentation" in str(got["out"])
    modules = set(got["modules"])  # type: ignore[call-overload]
    assert sorted(m for m in modules if m == "rich" or m.startswith("rich.")) == []
    assert sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER)) == []
