"""watch and trace against real targets on every installed CPython, through the real agent.

The target checks itself: asked through a control file, it reports whether each function's
``__code__`` is the very object it started with, whether every call still returned what it
should, and how many of the arguments it passed to a watched function are still alive.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flight_profiler.api import Session, connect
from support import PYTHONS, Target, spawn, temp_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLI = [sys.executable, "-m", "flight_profiler"]

TARGET = r'''
import asyncio, gc, json, os, sys, threading, time, types, weakref

CTL = sys.argv[1]


def work(x, scale=2):
    return x * scale


def boom(x):
    raise ValueError("bad %d" % x)


def keep(obj):
    return type(obj).__name__


class Model:
    def forward(self, x):
        return x + 1

    @classmethod
    def build(cls, n):
        return cls.__name__ + str(n)

    @staticmethod
    def norm(v):
        return abs(v)

    @property
    def size(self):
        return 42


def batches(n):
    for i in range(n):
        yield i
    return n


async def fetch(x):
    await asyncio.sleep(0)
    return x * 3


def outer(k):
    def inner(z):
        return z + k
    return inner(1)


def tiny(i):
    return i + 1


def step(n):
    total = 0
    for i in range(5):
        total += tiny(i)
    time.sleep(0.002)
    return total


def flood(x):
    return x


class Arg:
    pass


other = types.ModuleType("other_module")  # a module that imported `work` by name
other.work = work
model = Model()
bound_forward = model.forward  # captured before any hook
FUNCS = {"work": work, "boom": boom, "keep": keep, "forward": Model.forward,
         "build": Model.build.__func__, "norm": Model.norm, "size": Model.size.fget,
         "batches": batches, "fetch": fetch, "outer": outer, "step": step, "flood": flood}
ORIGINAL = {name: f.__code__ for name, f in FUNCS.items()}
INNER = [c for c in outer.__code__.co_consts if getattr(c, "co_name", "") == "inner"][0]
loop = asyncio.new_event_loop()
refs = []
state = {"rounds": 0, "mismatches": 0, "flooding": False, "seen": ""}


def one_round(i):
    got = [other.work(i), bound_forward(i), Model.build(i % 3), model.norm(-i), model.size,
           list(batches(3)), loop.run_until_complete(fetch(i)), outer(i), step(i)]
    want = [2 * i, i + 1, "Model%d" % (i % 3), i, 42, [0, 1, 2], 3 * i, i + 1, 15]
    try:
        boom(i)
        got.append("no exception")
    except ValueError as exc:
        got.append(str(exc))
    want.append("bad %d" % i)
    a = Arg()
    refs.append(weakref.ref(a))
    got.append(keep(a))
    want.append("Arg")
    del a
    del refs[:-50]
    if got != want:
        state["mismatches"] += 1
        print("MISMATCH", got, want, flush=True)


def flooder():
    x = 0
    while state["flooding"]:
        flood(x)
        x += 1


def rss_kb():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


import re


def answer(token, command):
    if command == "flood_on" and not state["flooding"]:
        state["flooding"] = True
        threading.Thread(target=flooder, daemon=True).start()
    elif command == "flood_off":
        state["flooding"] = False
    gc.collect()
    original = {name: FUNCS[name].__code__ is code for name, code in ORIGINAL.items()}
    original["inner"] = any(c is INNER for c in outer.__code__.co_consts)
    report = {"original": original, "mismatches": state["mismatches"], "rounds": state["rounds"],
              "alive": sum(r() is not None for r in refs), "rss_kb": rss_kb()}
    print("ANSWER %s %s" % (token, json.dumps(report)), flush=True)


print("READY", flush=True)
i = 0
while True:
    one_round(i)
    i += 1
    state["rounds"] = i
    try:
        with open(CTL) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if text and text != state["seen"]:
        state["seen"] = text
        token, _, command = text.partition(" ")
        if command == "exit":
            break
        answer(token, command)
    time.sleep(0.003)
print("EXIT", state["mismatches"], flush=True)
'''


class WatchTarget:
    def __init__(self, python: str) -> None:
        self.ctl = temp_dir("fp-ctl-") / "ctl"
        self.target: Target = spawn(TARGET, python=python, args=(str(self.ctl),))
        self.pid = self.target.pid
        self.asked = 0

    def ask(self, command: str = "check") -> dict[str, Any]:
        """Ask the target about itself (it answers between two rounds of calls)."""
        self.asked += 1
        token = f"t{self.asked}"
        tmp = self.ctl.with_suffix(".tmp")
        tmp.write_text(f"{token} {command}")
        os.replace(tmp, self.ctl)
        match = self.target.wait_for(rf"ANSWER {token} (.*)\n", timeout=20)
        report: dict[str, Any] = json.loads(match.group(1))
        return report

    def assert_pristine(self) -> None:
        report = self.ask()
        assert all(report["original"].values()), report["original"]
        assert report["mismatches"] == 0, self.target.stdout[-2000:]
        assert report["alive"] == 0  # no argument kept alive by a watch

    def finish(self) -> None:
        self.ctl.write_text(f"t{self.asked + 1} exit")
        assert self.target.popen.wait(30) == 0
        assert "EXIT 0" in self.target.stdout
        assert self.target.stderr == ""  # the agent printed nothing into the target's output
        assert not re.search(r"^(?!READY|ANSWER|EXIT).+", self.target.stdout, re.M)


@pytest.fixture
def make_target() -> Iterator[Any]:
    made: list[WatchTarget] = []

    def make(python: str) -> WatchTarget:
        t = WatchTarget(python)
        made.append(t)
        return t

    yield make
    for t in made:
        t.target.stop()


def spec(method: str, cls: str | None = None, nested: str | None = None) -> dict[str, Any]:
    return {"module": "__main__", "class": cls, "method": method, "nested": nested}


def watch(session: Session, **args: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    events: list[dict[str, Any]] = []
    result = session.request("watch", args, on_event=events.append)
    return [e for e in events if e["type"] == "call"], result


def first_int(text: str) -> int:
    return int(re.search(r"-?\d+", text).group())  # type: ignore[union-attr]


def values(call: dict[str, Any]) -> dict[str, str]:
    return dict(call["values"])


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_every_kind_of_target_then_pristine(make_target: Any, version: str) -> None:
    target = make_target(PYTHONS[version])
    with connect(target.pid, timeout=60) as session:
        n = first_int
        kinds = [  # every kind of target, each reached through the reference the target uses
            (spec("work"), lambda v: v["params"].endswith(", 2)") and n(v["return_obj"]) == 2 * n(v["params"])),
            (spec("forward", "Model"), lambda v: n(v["return_obj"]) == n(v["params"]) + 1),
            (spec("build", "Model"), lambda v: v["return_obj"] == f"'Model{n(v['params'])}'"),
            (spec("norm", "Model"), lambda v: n(v["return_obj"]) == -n(v["params"])),
            (spec("size", "Model"), lambda v: v["params"] == "()" and v["return_obj"] == "42"),
            (spec("batches"), lambda v: v["params"] == "(3,)" and v["return_obj"] == "3"),
            (spec("fetch"), lambda v: n(v["return_obj"]) == 3 * n(v["params"])),
            (spec("outer", nested="inner"), lambda v: v["params"] == "(1,)" and n(v["return_obj"]) >= 1),
        ]
        for target_spec, check in kinds:
            calls, result = watch(session, target=target_spec, count=2, timeout=20)
            assert result["reason"] == "count" and len(calls) == 2, (target_spec, result)
            for call in calls:
                assert check(values(call)), (target_spec, call)
            assert target.ask()["original"][target_spec["nested"] or target_spec["method"]]

        # expressions, a filter that sees params, -n counting matching calls only
        calls, result = watch(session, target=spec("work"), count=3, filter="params[0] % 7 == 0",
                              expr="params[0], return_obj // 2, cost >= 0, target")
        assert len(calls) == 3 and result["matched"] == 3 and result["calls"] > 3
        for call in calls:
            v = values(call)
            assert int(v["params[0]"]) % 7 == 0 and v["return_obj // 2"] == v["params[0]"]
            assert v["cost >= 0"] == "True" and v["target"] == "None"
        # exceptions only
        calls, _ = watch(session, target=spec("boom"), count=1, exceptions=True)
        assert re.fullmatch(r"ValueError: bad \d+", calls[0]["exception"])

        # trace: the tree below step(), the 5 tiny calls hidden with a count, sleep shown
        events: list[dict[str, Any]] = []
        result = session.request("trace", {"target": spec("step"), "count": 1, "min_ms": 0.5,
                                           "c_calls": True}, on_event=events.append)
        tree = next(e for e in events if e["type"] == "trace")["tree"]
        assert [c["name"] for c in tree["children"]] == ["builtin time.sleep"]
        assert tree["hidden"]["count"] >= 5
        assert result["matched"] == 1

        # a watch in progress is visible from inside the target (so the checks below can fail),
        # and the arguments it saw are not kept alive by it, even while it runs
        client = session._client()
        req = client.start("watch", {"target": spec("keep"), "timeout": 30})
        stream = client.messages(req)
        seen = [d for _, (k, d) in zip(range(4), stream) if k == "event"]
        assert seen[0]["type"] == "watching" and dict(seen[-1]["values"])["params"] == "(Arg(),)"
        during = target.ask()
        assert during["original"]["keep"] is False
        assert during["alive"] == 0
        client.cancel(req)
        client.drain(req)
        target.assert_pristine()
        session.detach()
    target.finish()


def _started(session: Session, args: dict[str, Any]) -> int:
    client = session._client()
    req = client.start("watch", args)
    kind, data = next(iter(client.messages(req)))
    assert kind == "event" and data["type"] == "watching"
    return req


@pytest.mark.slow
def test_hooks_removed_on_timeout_disconnect_detach_and_cli_interrupts(make_target: Any) -> None:
    version = "3.11" if "3.11" in PYTHONS else sorted(PYTHONS)[-1]
    target = make_target(PYTHONS[version])
    with connect(target.pid, timeout=60) as session:
        # --timeout
        calls, result = watch(session, target=spec("work"), timeout=0.3)
        assert result["reason"] == "timeout" and calls
        target.assert_pristine()
    # client disconnects without a word
    session = connect(target.pid, timeout=30)
    _started(session, {"target": spec("forward", "Model")})
    assert target.ask()["original"]["forward"] is False
    session._client().sock.close()
    _wait_pristine(target)
    # detach from another connection while a watch and a trace run
    watcher = connect(target.pid, timeout=30)
    _started(watcher, {"target": spec("work")})
    with connect(target.pid, timeout=30) as other:
        other.detach()
    _wait_pristine(target)
    watcher.close()
    # the CLI: Ctrl-C, then kill -9
    for sig, code in ((signal.SIGINT, 130), (signal.SIGKILL, -9)):
        cli = subprocess.Popen([*CLI, str(target.pid), "--cmd", "watch __main__ work"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_line(cli, "watching __main__.work")
            assert target.ask()["original"]["work"] is False
            cli.send_signal(sig)
            out, err = cli.communicate(timeout=30)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait(10)
        assert cli.returncode == code, (out, err)
        if sig == signal.SIGINT:
            assert "watch ended (cancelled)" in out and "hooks removed" in out
        _wait_pristine(target)
    target.finish()


def _wait_line(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if text in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"CLI never printed {text!r}: {seen} {proc.stderr.read() if proc.stderr else ''}")


def _wait_pristine(target: WatchTarget, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        report = target.ask()
        if all(report["original"].values()):
            assert report["mismatches"] == 0 and report["alive"] == 0
            return
        assert time.monotonic() < deadline, f"hooks still installed: {report['original']}"
        time.sleep(0.1)


@pytest.mark.slow
def test_flood_keeps_agent_memory_bounded(make_target: Any) -> None:
    version = "3.12" if "3.12" in PYTHONS else sorted(PYTHONS)[-1]
    target = make_target(PYTHONS[version])
    with connect(target.pid, timeout=60) as session:
        before = target.ask("flood_on")["rss_kb"]

        def slow_reader(event: dict[str, Any]) -> None:
            time.sleep(0.002)  # a client slower than a million calls a second

        result = session.request("watch", {"target": spec("flood"), "timeout": 3},
                                 on_event=slow_reader)
        after = target.ask("flood_off")["rss_kb"]
        assert result["calls"] > 100_000
        assert result["dropped"] > 0.9 * result["matched"]
        assert result["events"] + result["dropped"] == result["matched"]
        assert after - before < 20_000, f"agent memory grew {after - before} kB under a flood"
        session.detach()
    target.assert_pristine()
    target.finish()
