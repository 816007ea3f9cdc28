"""The typed request builders and the command grammar agree: a builder's request, written as its
command line and parsed again, is the same request (what users re-run from a diagnose report)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flight_profiler.errors import UsageError
from flight_profiler.requests import COMMANDS, AgentRequest, arm, basic, hooks, parse
from flight_profiler.requests import torch as t


def _census(path: Path) -> str:
    path.write_text(json.dumps({"format": "flight_profiler.census", "pid": 1, "time": 2.0,
                                "totals": {"count": 3}, "holders": [], "groups": []}))
    return str(path)


def _built(tmp: Path) -> list[AgentRequest]:
    spaced = tmp / "out dir"  # paths with spaces are quoted in the line
    return [
        basic.status(), basic.detach(), basic.fr(),
        basic.stack(), basic.stack(show_all=True, limit=5),
        basic.dataloader(), basic.dataloader(sample=0.25),
        hooks.watch(["__main__", "train_step"], expr="cost", count=1, timeout=7.0),
        hooks.watch(["mod", "Trainer", "step"], expr="params[0].shape, cost", condition="cost > 10",
                    exceptions=True, expand=2, count=3, timeout=0.1 + 0.2, nested="inner"),
        hooks.trace(["mod", "Trainer.step"], count=4, min_ms=0.01, depth=8, timeout=7.0),
        hooks.trace(["m", "f"], condition="params[0] == 'a b'", c_calls=True, nested="g"),
        t.memory(), t.memory(snapshot=True, file=str(spaced / "snap.pickle")),
        t.memory(["m", "f"], record=True, calls=4, file=str(tmp / "r.pickle"), timeout=7.0,
                 max_entries=1000, label="x"),
        t.memory(record_history="on", max_entries=5),
        t.tensors(), t.tensors(top=3, by="shape", file=str(tmp / "after.json"),
                               diff=_census(tmp / "before.json"), label="after", budget=2.5),
        t.profile(["m", "f"], schedule="0,1,4", file=str(tmp / "p.json.gz"), profile_memory=True,
                  with_stack=True, timeout=7.0),
        t.profile(duration=0.5, record_shapes=True, sort_by="count", row_limit=3,
                  tensorboard=str(tmp / "tb"), label="w"),
        t.grads(["m", "f"], calls=4, file=str(tmp / "g.json"), timeout=7.0),
        t.grads(calls=3, interval=1.0),
        t.anomaly(["m", "C", "f"], calls=1, timeout=7.0),
        arm.arm("hang", str(spaced), seconds=2.5, max_fires=3, duration=7200.0, threads="all"),
        arm.arm("nan", str(tmp)), arm.arm("oom", str(tmp), rss_limit=1 << 30, max_bytes=4096),
        arm.disarm(), arm.disarm("nan"),
    ]


def test_every_builder_round_trips_through_its_command_line(tmp_path: Path) -> None:
    (tmp_path / "out dir").mkdir()
    built = _built(tmp_path)
    for request in built:
        assert parse(request.line) == request, request.line
    # every command of the grammar has a builder
    assert {r.cmd for r in built} == set(COMMANDS)


def test_lines_show_what_was_given_in_a_fixed_order(tmp_path: Path) -> None:
    assert hooks.watch(["__main__", "train_step"], expr="cost", count=1, timeout=7.0).line == \
        "watch __main__ train_step --expr cost -n 1 --timeout 7"
    assert t.memory(snapshot=True, file=str(tmp_path / "a b.pickle")).line == \
        f"torch memory -s -f '{tmp_path}/a b.pickle'"
    # an option typed at its default stays in the line (a user typed it), one not typed does not
    assert parse("torch anomaly m f -n 1").line == "torch anomaly m f -n 1"
    assert parse("stack").line == "stack" and parse("stack").args == {"all": False, "limit": 200}
    # numbers are written so that they read back exactly
    assert float(parse(hooks.watch(["m", "f"], timeout=0.1 + 0.2).line).args["timeout"]) == 0.1 + 0.2


def test_builders_check_what_the_cli_checks_before_anything_is_sent(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="invalid -f expression"):
        hooks.watch(["m", "f"], condition="cost >")
    with pytest.raises(UsageError, match="--expr"):
        hooks.watch(["m", "f"], expr="params[0], (")
    with pytest.raises(UsageError, match="cannot be combined"):
        t.memory(snapshot=True, record=True)
    with pytest.raises(UsageError, match="or --duration SECONDS"):
        t.profile()
    with pytest.raises(UsageError, match="expected `module"):
        hooks.trace(["just_one_word"])
    assert t.tensors(file="rel.json").args["path"] == os.path.abspath("rel.json")


def test_every_command_has_its_own_renderers(tmp_path: Path) -> None:
    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.cli.agent_commands.base import render_json

    (tmp_path / "out dir").mkdir()
    for request in _built(tmp_path):
        shown = rendering(request.cmd)
        assert shown.result is not render_json, request.cmd  # JSON is the fallback only
    assert rendering("watch").event is not None and rendering("torch profile").event is not None
    assert rendering("no such handler").result is render_json
