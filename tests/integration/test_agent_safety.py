"""Nothing a request evaluates may end, interrupt, unwind or crash the target's threads.

Real targets on every installed CPython, through the real agent: expressions, filters and
reprs of the target's objects that raise SystemExit / KeyboardInterrupt / GeneratorExit, and
recursion bombs in a target that raised its recursion limit (3.9/3.10 overflowed their C stack
and died of SIGSEGV). The target checks its own work meanwhile: its calls return what they
should, its own SystemExit and its generators' GeneratorExit still reach it.
"""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest

from flight_profiler.api import Session, connect
from support import PYTHONS, Target, spawn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TARGET = r'''
import sys, time

if "--deep" in sys.argv:
    sys.setrecursionlimit(10**6)


def work(x):
    return x * 2


class Evil:
    def __repr__(self):
        raise SystemExit(9)


class Model:
    def forward(self, x):
        return 1


def batches(n):
    try:
        for i in range(n):
            yield i
    finally:
        state["closed"] += 1


def quits(code):
    raise SystemExit(code)  # its own: the caller catches it


class Node:
    def __init__(self, nxt):
        self.nxt = nxt

    def __repr__(self):  # recursive, as many a linked structure's
        return "Node(%r)" % (self.nxt,)


def walk(node):
    return node is not None


chain = None
for _ in range(100000 if "--deep" in sys.argv else 10):
    chain = Node(chain)
state = {"rounds": 0, "bad": 0, "closed": 0}
model, evil = Model(), Evil()
print("READY", flush=True)
while True:
    ok = work(3) == 6 and model.forward(evil) == 1 and walk(chain)
    for b in batches(5):
        if b == 1:
            break  # closes the generator: a GeneratorExit of its own, inside it
    try:
        quits(7)
        ok = False
    except SystemExit as exc:
        ok = ok and exc.code == 7
    state["rounds"] += 1
    state["bad"] += not ok
    if state["rounds"] % 100 == 0:
        print("ROUND %d bad=%d closed=%d" % (state["rounds"], state["bad"], state["closed"]),
              flush=True)
    time.sleep(0.001)
'''


def spec(method: str, cls: str | None = None) -> dict[str, Any]:
    return {"module": "__main__", "class": cls, "method": method, "nested": None}


def run(session: Session, proc: Target, cmd: str, **args: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    events: list[dict[str, Any]] = []
    args.setdefault("timeout", 20)
    result = session.request(cmd, args, on_event=events.append)
    assert proc.alive(), f"{cmd} {args} killed the target:\n{proc.stderr[-2000:]}"
    return [e for e in events if e["type"] in ("call", "trace")], result


def only_value(calls: list[dict[str, Any]]) -> str:
    assert calls, "no call was reported"
    return str(calls[0]["values"][0][1])


def healthy(target: Target) -> None:
    """The target goes on, and its own checks held all along."""
    seen = len(target.stdout)
    match = target.wait_for(r"ROUND (\d+) bad=(\d+) closed=(\d+)\n", timeout=30, start=seen)
    rounds, bad, closed = (int(g) for g in match.groups())
    assert bad == 0 and closed == rounds, match.group(0)


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_what_a_request_evaluates_never_ends_or_interrupts_the_target(version: str) -> None:
    target = spawn(TARGET, python=PYTHONS[version])
    try:
        with connect(target.pid, timeout=60) as session:
            work = spec("work")
            for expr, shown in [
                ("exit(3)", "<error: SystemExit: 3>"),
                ("__import__('sys').exit(4)", "<error: SystemExit: 4>"),
                ("(_ for _ in ()).throw(KeyboardInterrupt)", "<error: KeyboardInterrupt>"),
                ("(_ for _ in ()).throw(GeneratorExit)", "<error: GeneratorExit>"),
                ("exec('raise KeyboardInterrupt')", "<error: KeyboardInterrupt>"),
            ]:
                calls, result = run(session, target, "watch", target=work, expr=expr, count=1)
                assert only_value(calls) == shown and result["reason"] == "count", (expr, calls)
            # the same behind a filter the wrapper runs inline, and in a generator's watch
            calls, _ = run(session, target, "watch", target=work, filter="params[0] > 0",
                           expr="exit(6)", count=1)
            assert only_value(calls) == "<error: SystemExit: 6>"
            calls, _ = run(session, target, "watch", target=spec("batches"),
                           expr="exec('raise GeneratorExit')", count=1)
            assert only_value(calls) == "<error: GeneratorExit>"
            # a filter that raises: on entry (it calls something), on exit (it sees cost)
            for cmd in ("watch", "trace"):
                for condition, error in [("exit(3)", "SystemExit: 3"),
                                         ("cost >= 0 and __import__('sys').exit(5)", "SystemExit: 5")]:
                    calls, result = run(session, target, cmd, target=work, filter=condition, timeout=1)
                    assert not calls and result["filter_errors"] > 0, (cmd, condition, result)
                    assert result["first_filter_error"] == error and result["callback_errors"] == 0
            # the repr of one of the target's objects raises SystemExit
            calls, _ = run(session, target, "watch", target=spec("forward", "Model"), count=1)
            assert dict(calls[0]["values"])["params"] == "(<repr failed: SystemExit>,)"
            # the function's own SystemExit still reaches its caller (it checks), and is shown
            calls, _ = run(session, target, "watch", target=spec("quits"), filter="params[0] == 7",
                           count=1)
            assert calls[0]["exception"] == "SystemExit: 7"
            healthy(target)
            session.detach()
        healthy(target)
        assert target.stderr == ""
    finally:
        target.stop()


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_recursion_bombs_are_bounded_in_a_target_that_raised_its_limit(version: str) -> None:
    target = spawn(TARGET, python=PYTHONS[version], args=("--deep",))
    try:
        with connect(target.pid, timeout=60) as session:
            work = spec("work")
            bomb = "(lambda f: f(f))(lambda f: f(f))"
            nested = "repr(__import__('functools').reduce(lambda a, _: [a], range(200000), []))"
            for expr in (bomb, nested):
                started = time.monotonic()
                calls, _ = run(session, target, "watch", target=work, expr=expr, count=1)
                # 3.14 says "Stack overflow (used N kB)" where the C stack runs out first
                assert re.match(r"<error: RecursionError: (maximum recursion|Stack overflow)",
                                only_value(calls)), calls
                # a million frames would take seconds (and a quarter GB): bounded near the caller
                assert time.monotonic() - started < 20
            # the default view of an argument whose own __repr__ recurses 100,000 deep
            calls, _ = run(session, target, "watch", target=spec("walk"), count=1)
            assert dict(calls[0]["values"])["params"] == "(<repr failed: RecursionError>,)"
            for cmd in ("watch", "trace"):
                _, result = run(session, target, cmd, target=work, filter=bomb, timeout=1)
                assert result["first_filter_error"].startswith("RecursionError"), result
            healthy(target)
            session.detach()
        healthy(target)
        assert target.stderr == ""
    finally:
        target.stop()


SIGNALLED = r'''
import signal, sys, time

if "--term" in sys.argv:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))


def slow(x):
    return x


print("READY", flush=True)
try:
    i = 0
    while True:
        slow(i)
        i += 1
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
except SystemExit:
    print("TERMINATED", flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm-handler"])
def test_the_targets_own_signal_still_interrupts_it_while_our_code_runs(how: str) -> None:
    # Nearly all of the target's time is spent in our expression: a Ctrl-C (or a SIGTERM
    # handler's SystemExit) raised there is the target's, not the expression's error.
    version = "3.11" if "3.11" in PYTHONS else sorted(PYTHONS)[-1]
    sig, args, said = ((signal.SIGINT, (), "INTERRUPTED") if how == "ctrl-c"
                       else (signal.SIGTERM, ("--term",), "TERMINATED"))
    target = spawn(SIGNALLED, python=PYTHONS[version], args=args)
    try:
        session = connect(target.pid, timeout=60)
        client = session._client()
        req = client.start("watch", {"target": spec("slow"), "expr": "sum(range(2000000))",
                                     "timeout": 60})
        stream = client.messages(req)
        seen = [data for _, (kind, data) in zip(range(4), stream) if kind == "event"]
        assert [e["type"] for e in seen[1:]] == ["call"] * 3  # our code runs, call after call
        target.popen.send_signal(sig)
        target.wait_for(said, timeout=30)
        assert target.popen.wait(30) == 0
        assert not re.search("Traceback", target.stderr)
        session.close()
    finally:
        target.stop()
