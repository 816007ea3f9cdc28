"""The CLI imports only what a command needs: `--help` no more than click, and a command to an
agent that is already running neither the injector, the report engine, the renderers of
reports, msgspec nor torch (bench/bench_cli_startup.py measures what each costs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_agent import FakeAgent
from support import REPO

ANSWERS = json.loads((REPO / "tests" / "fixtures" / "answers" / "answers.json").read_text())

# Runs the console script's main() in this interpreter, then writes the names of every module
# it imported to the file named by the first argument.
PROBE = r"""
import json, sys
out = sys.argv[1]
sys.argv = ["flight_profiler", *sys.argv[2:]]
from flight_profiler.cli.main import main
try:
    main()
except SystemExit:
    pass
with open(out, "w") as fh:
    json.dump(sorted(sys.modules), fh)
"""

# Never for a command to a running agent: attaching (the injectors), offline diagnosis and its
# renderers, and the third-party modules only they use.
NEVER = ("torch", "numpy", "msgspec", "flight_profiler.attach.inject", "flight_profiler.attach.ptrace",
         "flight_profiler.attach.ptrace_inject", "flight_profiler.attach.gdb",
         "flight_profiler.attach.remote_exec", "flight_profiler.attach.staging",
         "flight_profiler.report.engine", "flight_profiler.report.trace_loader",
         "flight_profiler.render", "flight_profiler.diagnose")


def imported(tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert out.exists(), done
    return set(json.loads(out.read_text()))


def _found(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_help_imports_neither_click_nor_anything_of_the_commands(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--help")
    assert "flight_profiler.cli.quick_help" in modules  # the probe saw the CLI run
    assert _found(modules, (*NEVER, "click", "rich", "flight_profiler.api", "flight_profiler.client",
                            "flight_profiler.requests", "flight_profiler.attach")) == []


def test_a_subcommands_help_imports_click_and_nothing_of_the_others(tmp_path: Path) -> None:
    modules = imported(tmp_path, "ps", "--help")
    assert "click" in modules and "flight_profiler.cli.ps_cmd" in modules
    assert _found(modules, (*NEVER, "flight_profiler.api", "flight_profiler.client",
                            "flight_profiler.requests", "flight_profiler.cli.report_cmd",
                            "flight_profiler.cli.diagnose_cmd")) == []


@pytest.mark.parametrize("cmd,extra,allowed_rich", [
    ("status", ["--json"], False),
    ("status", [], True),    # its table is rich's
    ("stack", [], True),
])
def test_a_command_to_a_running_agent_imports_no_injector_report_engine_or_torch(
        tmp_path: Path, cmd: str, extra: list[str], allowed_rich: bool) -> None:
    with FakeAgent({"by_cmd": {cmd: [{"result": ANSWERS[cmd]["result"]}]}}) as fake:
        modules = imported(tmp_path, str(fake.pid), "--cmd", cmd, *extra)
        sent = [m.get("cmd") for m in fake.received()]
    assert cmd in sent  # the command really went to the agent
    assert _found(modules, NEVER + (() if allowed_rich else ("rich",))) == []
