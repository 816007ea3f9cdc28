"""A malformed answer ends in one line and exit code 14, never in a traceback.

`uptime_s` a string, a frame without `file`, wrong types, missing keys, nested junk, huge
integers, NaN: each answer is checked against its handler's shape where it enters the CLI
(flight_profiler.answers, in api.Session), so renderers, diagnose and the rank views only ever
see answers they can use. The end-to-end tests ended in tracebacks before this change; the
seeded fuzzers mutate every real answer of every handler (tests/fixtures/answers) and check that
each mutation is either refused as malformed or shown without error.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from fake_agent import FakeAgent, run_cli
from flight_profiler import answers
from flight_profiler.cli.agent_commands import rendering
from flight_profiler.errors import BadAnswer, ExitCode, FlightProfilerError
from support import REPO

ANSWERS = json.loads((REPO / "tests" / "fixtures" / "answers" / "answers.json").read_text())
STATUS = ANSWERS["status"]["result"]
STACK = ANSWERS["stack"]["result"]


def _one_line(run: Any, text: str) -> None:
    assert run.returncode == ExitCode.BAD_ANSWER, run
    assert "Traceback" not in run.stderr, run
    assert run.stderr.splitlines()[0].startswith(f"error: the agent's answer was malformed: {text}"), run


@pytest.mark.parametrize(("cmd", "answer", "text"), [
    ("status", {**STATUS, "uptime_s": "a while"},
     "status: uptime_s: expected a number, got a string"),
    ("stack", {"threads": [{**STACK["threads"][0], "frames": [{"line": 3, "function": "f"}]}]},
     "stack: threads[0].frames[0].file: missing"),
    ("status", {**STATUS, "python": ["3.12"]}, "status: python: expected an object, got a list"),
    ("stack", {"threads": {"0": {}}}, "stack: threads: expected a list, got an object"),
    ("status", {**STATUS, "threads": {"total": 1e400}},
     "status: threads.total: expected an integer, got a number"),
], ids=["uptime-string", "frame-without-file", "python-a-list", "threads-an-object", "total-inf"])
def test_a_malformed_result_is_one_line_and_exit_14(cmd: str, answer: dict[str, Any], text: str) -> None:
    with FakeAgent({"by_cmd": {cmd: [{"result": answer}]}}) as fake:
        run = run_cli(str(fake.pid), "--cmd", cmd, limit=60)
    _one_line(run, text)


@pytest.mark.parametrize(("frame", "text"), [
    ({"send": {"type": "result", "id": "$id", "data": "fine"}}, "result: data: expected an object, got str"),
    ({"send": {"type": "error", "id": "$id", "error": "boom"}}, "error: expected an object, got str"),
    ({"send": {"type": "error", "id": "$id", "error": {"message": ["x"]}}},
     "error.message: expected a string, got list"),
    ({"raw": "0000000aff00112233445566778899"}, "a frame that is not JSON ("),
    ({"send": ["a", "list"]}, "a frame that is not a JSON object"),
], ids=["data-a-string", "error-a-string", "error-message-a-list", "not-utf8", "not-an-object"])
def test_a_malformed_frame_is_one_line_and_exit_14(frame: dict[str, Any], text: str) -> None:
    with FakeAgent({"requests": [[frame]]}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", limit=60)
    _one_line(run, text)


def test_nan_is_a_number_and_is_shown() -> None:
    with FakeAgent({"by_cmd": {"status": [{"send": {"type": "result", "id": "$id", "data": {
            **STATUS, "uptime_s": math.nan}}}]}}) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", limit=60)
    assert run.returncode == 0 and "(up nans)" in run.stdout, run


def test_the_shell_says_it_in_one_line_and_goes_on() -> None:
    spec = {"by_cmd": {"status": [{"result": {**STATUS, "uptime_s": "x"}}],
                       "stack": [{"result": STACK}]}}
    with FakeAgent(spec) as fake:
        run = run_cli(str(fake.pid), stdin="status\nstack\nquit\n", limit=60)
    assert "error: the agent's answer was malformed: status: uptime_s" in run.stderr, run
    assert "Thread MainThread" in run.stdout and "Traceback" not in run.stderr, run


def test_diagnose_against_an_agent_that_answers_junk_is_incomplete_not_a_traceback(
        tmp_path: Path) -> None:
    junk = [{"send": {"type": "result", "id": "$id", "data": {
        "torch": "yes", "python": 3, "mode": [], "totals": "many", "models": {"a": 1},
        "measurements": [1], "loaders": 5, "threads": "x", "top_ops": []}}}]
    with FakeAgent({"requests": [junk]}) as fake:
        run = run_cli("diagnose", str(fake.pid), "m", "f", "--timeout", "2", "--out",
                      str(tmp_path / "out"), limit=240)
    assert run.returncode == ExitCode.INCOMPLETE, run
    assert "Traceback" not in run.stderr and "malformed" in run.stdout + run.stderr, run


# -- seeded fuzzers over every handler's real answers ---------------------------------------------
JUNK: list[Any] = [None, "", "x", -1, 0, 2**70, 1e308, math.nan, math.inf, -math.inf, True, [],
                   {}, [[[]]], {"a": {"b": [None]}}, [1, "a", None], "\x1b[2J", 10**30, 3.5]


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if len(at) > 30:  # not inside a nest a previous edit made
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def mutate(doc: Any, rng: random.Random) -> Any:
    """One to three random edits: a value replaced by junk, a key removed, a value wrapped."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return rng.choice(JUNK)
        path = rng.choice(paths)
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        action = rng.random()
        if action < 0.2 and isinstance(parent, dict):
            del parent[last]
        elif action < 0.3:
            parent[last] = [copy.deepcopy(parent[last]) for _ in range(rng.randint(0, 3))]
        elif action < 0.35:
            nested: Any = parent[last]
            for _ in range(rng.randint(1, 100)):
                nested = [nested]
            parent[last] = nested
        else:
            # a copy: a later edit of this document may go inside it, and JUNK is shared by
            # every case (an edited JUNK list grew from case to case until one hung)
            parent[last] = copy.deepcopy(rng.choice(JUNK))
    return doc


def _render(cmd: str, result: Any, events: list[Any]) -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=False, width=120)
    shown = rendering(cmd)
    for event in events:
        answers.check_event(cmd, event)
        if shown.event is not None:
            shown.event(event, console)
    if result is not None:
        answers.check_result(cmd, result)
        shown.result(result, console)


@pytest.mark.parametrize("name", sorted(n for n in ANSWERS if "result" in ANSWERS[n]))
def test_every_mutation_is_refused_or_shown(name: str) -> None:
    answer = ANSWERS[name]
    rng = random.Random(f"fp-malformed-{name}")  # seeded: a failure replays
    refused = shown = 0
    for _ in range(100):
        result = mutate(answer["result"], rng)
        events = [mutate(e, rng) if rng.random() < 0.3 else e for e in answer["events"]]
        try:
            _render(answer["cmd"], result, events)
            shown += 1
        except BadAnswer as exc:
            assert exc.message.startswith("the agent's answer was malformed: "), exc.message
            refused += 1
    assert refused and shown, (refused, shown)  # both paths were taken


def test_the_real_answers_of_every_handler_pass_their_shapes() -> None:
    for answer in ANSWERS.values():
        if "result" in answer:
            answers.check_result(answer["cmd"], answer["result"])
        for event in answer["events"]:
            answers.check_event(answer["cmd"], event)


class _ReplayDriver:
    """Answers each diagnose request with a (mutated) real answer of its handler, checked as
    Session.execute checks it."""

    def __init__(self, rng: random.Random, tmp: Path) -> None:
        self.rng = rng
        by_cmd: dict[str, list[dict[str, Any]]] = {}
        for answer in ANSWERS.values():
            if "result" in answer:
                by_cmd.setdefault(answer["cmd"], []).append(answer)
        self.by_cmd = by_cmd

    def run(self, request: Any, on_event: Callable[[dict[str, Any]], None] | None = None,
            timeout: float | None = None) -> dict[str, Any]:
        answer = self.rng.choice(self.by_cmd[request.cmd])
        for event in answer["events"]:
            event = mutate(event, self.rng) if self.rng.random() < 0.3 else event
            answers.check_event(request.cmd, event)
            if on_event is not None:
                on_event(event)
        result = mutate(answer["result"], self.rng) if self.rng.random() < 0.5 else answer["result"]
        answers.check_result(request.cmd, result)
        path = request.args.get("path")
        if isinstance(path, str):  # the file a phase expects: present, whatever it holds
            Path(path).write_text(json.dumps(result))
        return copy.deepcopy(result)


@pytest.mark.parametrize("seed", range(20))
def test_diagnose_consumes_any_answer_that_passes_its_shape(seed: int, tmp_path: Path) -> None:
    from flight_profiler.diagnose.model import DiagnoseOptions, MethodTarget
    from flight_profiler.diagnose.workflow import run_diagnosis

    rng = random.Random(seed)
    options = DiagnoseOptions(pid=os.getpid(), target=MethodTarget.parse(("m", "f")),
                              out_dir=str(tmp_path / "out"), calls=2, duration=0.0, timeout=1.0)
    try:
        result = run_diagnosis(_ReplayDriver(rng, tmp_path), options)  # type: ignore[arg-type]
    except FlightProfilerError:
        return  # a phase found the method unusable: the diagnosis stops with one line
    assert result.phases  # every phase ended ok, skipped, timed out or failed: no traceback
