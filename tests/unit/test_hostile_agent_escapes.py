"""Text from a target or a file never drives root's terminal: control characters are shown.

A thread name, a repr, a function or file name, an agent's error or status field, a name inside
a trace: each may hold an OSC title (``ESC ] 0 ; ... BEL``), a screen clear (``ESC [ 2 J``), a
hyperlink, a bidi override or a lone surrogate. Every renderer shows them as ``\\x1b``,
``\\u202e``... (flight_profiler.safe_text); ``--json`` stays valid JSON that escapes them. On the
code before this change each end-to-end test below found raw escapes in the CLI's output (or a
traceback: a lone surrogate cannot be printed, a ``[/bold]`` in a name broke rich's markup).
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from fake_agent import FakeAgent, run_cli
from flight_profiler import answers
from flight_profiler.cli.agent_commands import rendering
from flight_profiler.render.formats import render_report
from flight_profiler.render.report_terminal import print_report
from flight_profiler.report.models import Finding, InputResult, Report
from flight_profiler.safe_text import is_safe, safe_text
from support import REPO

# An OSC window title, a screen clear, a hyperlink, a bidi override, a C1 CSI, a lone surrogate,
# a line separator and rich markup that closes a tag it did not open.
HOSTILE = ("\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\"
           "\u202egnp.exe\x9b31m\ud800\u2028[/bold][red]")
ANSWERS = json.loads((REPO / "tests" / "fixtures" / "answers" / "answers.json").read_text())
# Strings that choose a branch rather than being shown: kept, so the poisoned answer still
# takes the renderer's normal path (a second pass poisons them too).
ENUM_KEYS = {"mode", "type", "event", "phase", "by", "what", "kind"}
# Answers whose views show none of the agent's strings (counts and sizes only; an error frame)
NO_TEXT = {"detach", "torch memory", "torch memory --record-history on"}


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` that would act on a terminal (a newline is ours)."""
    return sorted({ch for ch in text if ch != "\n" and (
        unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"))})


def poison(value: Any, everything: bool = False, key: str = "") -> Any:
    if isinstance(value, str):
        return value if (key in ENUM_KEYS and not everything) else value + HOSTILE
    if isinstance(value, list):
        return [poison(v, everything, key) for v in value]
    if isinstance(value, dict):
        return {k: poison(v, everything, k) for k, v in value.items()}
    return value


def render_all(cmd: str, result: dict[str, Any] | None, events: list[dict[str, Any]]) -> str:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=160)
    shown = rendering(cmd)
    for event in events:
        answers.check_event(cmd, event)
        (shown.event or (lambda d, c: None))(event, console)
    if result is not None:
        answers.check_result(cmd, result)
        shown.result(result, console)
    return out.getvalue()


@pytest.mark.parametrize("everything", [False, True], ids=["values", "also-enum-values"])
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_every_renderer_shows_hostile_text_escaped(name: str, everything: bool) -> None:
    # GIVEN a real answer of the agent whose every string carries terminal escapes
    answer = ANSWERS[name]
    result = poison(answer.get("result"), everything)
    events = poison(answer["events"], everything)
    # WHEN the CLI renders it as it would on a terminal
    text = render_all(answer["cmd"], result, events)
    # THEN nothing of it reaches the terminal raw, and the escapes are shown
    assert raw_controls(text) == [], text
    if name not in NO_TEXT:  # what was shown was the poisoned text, escaped
        assert "\\x1b]0;pwned\\x07" in text, text


@pytest.mark.parametrize("map_key", ["tensors_by_device", "allocator_settings"])
def test_free_keys_of_an_answer_are_escaped_too(map_key: str) -> None:
    result = {"mode": "summary", "rss_bytes": 1, "cuda": True,
              "devices": [{"device": "cuda:0", "allocated": 1, "reserved": 2,
                           "peak_allocated": 1, "fragmentation": 1}],
              "tensors_by_device": {"cpu": {"count": 1, "bytes": 4}}, "allocator_settings": {}}
    result[map_key] = {HOSTILE: {"count": 1, "bytes": 4} if map_key == "tensors_by_device" else "x"}
    text = render_all("torch memory", result, [])
    assert raw_controls(text) == [] and "\\x1b]0;pwned" in text, text


def test_safe_text_shows_every_control_and_keeps_every_script() -> None:
    assert safe_text("a\x1b[2Jb\u202ec\ud800\x9b") == "a\\x1b[2Jb\\u202ec\\ud800\\x9b"
    assert safe_text("données 数据 🚀 \u00a0x") == "données 数据 🚀 \u00a0x"
    assert safe_text("x" * 10, 4) == "xxxx…(+6 chars)"
    assert safe_text("a\nb") == "a\\x0ab" and safe_text("a\nb", newlines=True) == "a\nb"
    assert is_safe(safe_text(HOSTILE))


# -- end to end: the CLI against a fake agent --------------------------------------------------
STATUS = {"agent_version": HOSTILE, "pid": 1, "uptime_s": 1.5,
          "python": {"version": "3.12" + HOSTILE, "executable": HOSTILE, "argv": [HOSTILE]},
          "threads": {"total": 2, "agent": 1},
          "torch": {"imported": True, "version": HOSTILE, "cuda_available": None,
                    "cuda_error": HOSTILE},
          "active_hooks": [HOSTILE]}
STACK = {"threads": [{"name": HOSTILE, "native_id": 5, "main": True, "frames": [
    {"file": HOSTILE, "line": 3, "function": HOSTILE}]}], "hidden_agent_threads": 0}
WATCH_EVENTS = [{"type": "watching", "target": HOSTILE, "note": HOSTILE, "filter": HOSTILE},
                {"type": "call", "ts": 1.0, "n": 1, "thread": HOSTILE, "cost_ms": 1.0,
                 "exception": HOSTILE, "values": [[HOSTILE, HOSTILE]]},
                {"type": "filter_error", "message": HOSTILE}]
WATCH_END = {"reason": HOSTILE, "elapsed_s": 1.0, "calls": 1, "matched": 1, "events": 1,
             "filter_errors": 1, "first_filter_error": HOSTILE}


def _hostile_agent() -> FakeAgent:
    error = {"error": {"kind": "failed", "message": HOSTILE, "hint": HOSTILE}}
    return FakeAgent({"by_cmd": {
        "status": [{"result": STATUS}], "stack": [{"result": STACK}],
        "watch": [*({"event": e} for e in WATCH_EVENTS), {"result": WATCH_END}],
        "torch fr": [error]}})


def _assert_clean(text: str) -> None:
    assert raw_controls(text) == [], text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("command", ["status", "stack", "watch m f", "torch fr"])
def test_the_cli_shows_a_hostile_agents_text_escaped(command: str) -> None:
    with _hostile_agent() as fake:
        run = run_cli(str(fake.pid), "--cmd", command, limit=60)
    _assert_clean(run.stdout + run.stderr)
    assert "\\x1b]0;pwned\\x07" in run.stdout + run.stderr, run
    assert run.returncode == (1 if command == "torch fr" else 0), run


def test_json_output_stays_valid_and_escapes_everything() -> None:
    with _hostile_agent() as fake:
        run = run_cli(str(fake.pid), "--cmd", "stack", "--json", limit=60)
    _assert_clean(run.stdout)
    assert json.loads(run.stdout)["threads"][0]["name"] == HOSTILE  # what the agent sent, exactly


def test_the_shell_shows_a_hostile_agents_text_escaped() -> None:
    with _hostile_agent() as fake:
        run = run_cli(str(fake.pid), stdin="status\nstack\ntorch fr\nquit\n", limit=60)
    _assert_clean(run.stdout + run.stderr)
    assert (run.stdout + run.stderr).count("\\x1b]0;pwned\\x07") >= 3, run


def test_ps_shows_a_hostile_command_line_escaped() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", HOSTILE[:60]
                                .replace("\ud800", "")], stdin=subprocess.DEVNULL)
    try:
        run = run_cli("ps", limit=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    _assert_clean(run.stdout + run.stderr)
    assert str(sleeper.pid) in run.stdout


# -- reports: names from a hostile file -----------------------------------------------------------
def _hostile_report() -> Report:
    path = f"/tmp/{HOSTILE}.json.gz"
    finding = Finding(rule="hot-operators", severity="warning", title=f"slow {HOSTILE}",
                      summary=HOSTILE, evidence=[HOSTILE], where=[HOSTILE], fix=[HOSTILE],
                      root_cause=HOSTILE, inputs=[path])
    data = {"events": 3, "window_us": 10.0,
            "top_operators": [{"name": HOSTILE, "calls": 1, "self_us": 5.0}],
            "top_kernels": [{"name": HOSTILE, "calls": 1, "total_us": 5.0}]}
    return Report(inputs=[InputResult(path, "trace", True, data=data),
                          InputResult(f"/tmp/bad{HOSTILE}", "unknown", False, error=HOSTILE)],
                  findings=[finding])


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_files_show_hostile_names_escaped(fmt: str) -> None:
    text = render_report(_hostile_report(), fmt)
    _assert_clean(text)
    assert "\\x1b]0;pwned\\x07" in text
    if fmt == "html":
        assert "[/bold][red]" in text and "<script" not in text


def test_the_terminal_report_shows_hostile_names_escaped() -> None:
    from rich.console import Console

    out = io.StringIO()
    print_report(_hostile_report(), Console(file=out, force_terminal=False, width=120))
    _assert_clean(out.getvalue())
    assert "\\x1b]0;pwned\\x07" in out.getvalue()


def test_report_on_a_trace_with_hostile_names(tmp_path: Path) -> None:
    # GIVEN a real trace whose operator names and file name carry escapes
    with gzip.open(REPO / "tests" / "fixtures" / "traces" / "cpu_healthy.json.gz", "rt") as fh:
        trace = json.load(fh)
    for event in trace["traceEvents"]:
        if isinstance(event.get("name"), str):
            event["name"] = event["name"] + HOSTILE.replace("\ud800", "")
    bad = copy.deepcopy(trace)
    path = tmp_path / ("run\x1b]0;pwned\x07.json")
    path.write_text(json.dumps(bad))
    for extra in ([], ["--format", "md"], ["--format", "html"]):
        run = run_cli("report", str(path), *extra, limit=120)
        _assert_clean(run.stdout + run.stderr)
        assert run.returncode == 0, run
        assert "\\x1b]0;pwned\\x07" in run.stdout, run  # the file's name, shown escaped
