"""Overhead of watch and trace, as ratios measured in one run (machines are shared and noisy).

    python bench/bench_watch.py            # in-process agent: handler thread + the same hooks
    python bench/bench_watch.py --attach   # also through a real attached agent (a target child)

Each scenario alternates its baseline and instrumented runs several times and compares the best
(minimum) times, so a burst of noise from other processes cannot masquerade as overhead. Time is
the PROCESS's CPU time (time.process_time): what the target pays, the agent's own threads (the
handler that renders and sends events) included, and immune to other processes on the machine.

Scenarios (the peer's figures, measured on this kind of machine, in shared/design/peers.md):
  filtered      `work` (~1 us) watched with a filter on its arguments that never matches:
                decided on entry, the call then runs untimed                   (peer 7-10x)
  filtered-cost the same with a filter on `cost` (decided on exit: every call is timed)
  reported      `work` watched, no filter: every call matches. A flood: the agent sends what
                the stream carries and counts the rest as dropped; measured in that steady
                state (queue full)                                             (peer ~30x)
  reported-all  the same with an unbounded queue: EVERY call rendered and sent (the cost of
                one reported call; the real agent never does this, it drops)
  trace         `step`, a method making 50 tiny calls (~45 ns each), traced on every call; a
                flood again: in the steady state calls are dropped before recording
  trace-all     the same with an unbounded queue: every call recorded, its tree built and
                queued: the cost of one traced call                          (peer 20-50x)
  trace-small   a method making 50 small calls (~1 us each), every call recorded and sent
  elsewhere     `work` while a watch is active on another function           (should be 1.00x)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

from flight_profiler.agent import registry  # noqa: E402
from flight_profiler.agent.commands import trace as trace_mod  # noqa: E402
from flight_profiler.agent.commands import watch as watch_mod  # noqa: E402
from flight_profiler.agent.registry import Context  # noqa: E402

QUEUE_MAX = watch_mod.QUEUE_MAX


def work(x: int) -> int:
    s = 0
    for i in range(30):
        s += i * x
    return s


def other(x: int) -> int:
    return x


def tiny(i: int) -> int:
    return i + 1


class Model:
    def step(self, n: int) -> int:
        total = 0
        for i in range(50):
            total += tiny(i)
        return total

    def step_small(self, n: int) -> int:
        total = 0
        for i in range(50):
            total += work(i)
        return total


MODEL = Model()


def loop_work(n: int) -> float:
    t0 = time.process_time()
    for i in range(n):
        work(i)
    return time.process_time() - t0


def loop_step(n: int) -> float:
    t0 = time.process_time()
    step = MODEL.step
    for i in range(n):
        step(i)
    return time.process_time() - t0


def loop_step_small(n: int) -> float:
    t0 = time.process_time()
    step = MODEL.step_small
    for i in range(n):
        step(i)
    return time.process_time() - t0


class InProcessAgent:
    """A handler thread running one command, emitting JSON to /dev/null like a socket would."""

    def __init__(self, cmd: str, args: dict[str, Any], unbounded: bool = False,
                 saturate: bool = False) -> None:
        self.unbounded = unbounded
        self.saturate = saturate
        self.sink = open(os.devnull, "w")  # noqa: SIM115
        self.events = 0
        self.ctx = Context(args, emit=self._emit)
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(cmd,), daemon=True)

    def _emit(self, data: dict[str, Any]) -> None:
        self.sink.write(json.dumps(data) + "\n")
        self.events += 1

    def _run(self, cmd: str) -> None:
        self.result = registry.run(self.ctx, cmd)

    def __enter__(self) -> InProcessAgent:
        if self.unbounded:
            watch_mod.QUEUE_MAX = trace_mod.QUEUE_MAX = 10**9
        self.thread.start()
        time.sleep(0.05)  # the hook is installed well before the measurement
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.cancel()
        self.thread.join(60)
        self.sink.close()
        watch_mod.QUEUE_MAX = trace_mod.QUEUE_MAX = QUEUE_MAX


def target(method: str, cls: str | None = None) -> dict[str, Any]:
    return {"module": __name__, "class": cls, "method": method, "nested": None}


def measure(
    loop: Callable[[int], float], n: int, agent: Callable[[], Any] | None, rounds: int
) -> tuple[float, float, dict[str, Any]]:
    """Best per-call seconds (baseline, instrumented) over alternating rounds."""
    base, inst = [], []
    result: dict[str, Any] = {}
    for _ in range(rounds):
        base.append(loop(n))
        if agent is None:
            inst.append(loop(n))
            continue
        with agent() as a:
            if a.saturate:  # reach the steady state of a flood first: the queue is full
                loop(2 * QUEUE_MAX)
            inst.append(loop(n))
        result = dict(a.result, events_emitted=a.events)
    return min(base) / n, min(inst) / n, result


CHILD = """
import sys, time
sys.path.insert(0, {src!r})
sys.path.insert(0, {bench!r})
import bench_watch as b
sys.modules["__main__"].__dict__.update(work=b.work, other=b.other, Model=b.Model)
print("READY", flush=True)
while True:
    print("work", b.loop_work(20000) / 20000, flush=True)
    print("step", b.loop_step(1000) / 1000, flush=True)
"""


def _count_into(stream: Any, events: list[int]) -> None:
    for _ in stream:
        events.append(1)


def hook_vs_monitoring(rounds: int, n: int) -> dict[str, Any]:
    """Why hooks.py swaps code instead of using sys.monitoring (3.12+): the cheapest equivalent
    observer with each, on `work`. sys.monitoring's PY_START has no arguments (read back from
    the frame here) and its PY_UNWIND (exceptions) cannot be enabled per function at all."""
    from flight_profiler.agent import hooks, targets

    if sys.version_info < (3, 12):
        return {}
    mon = sys.monitoring  # type: ignore[attr-defined]
    clock = time.perf_counter_ns
    stack: list[int] = []
    sink: list[Any] = []

    def on_start(code: Any, offset: int) -> None:
        frame = sys._getframe(1)
        sink.append(tuple(frame.f_locals.values())[: code.co_argcount])
        stack.append(clock())
        sink.clear()

    def on_return(code: Any, offset: int, value: Any) -> None:
        sink.append(clock() - stack.pop())
        sink.clear()

    tool = next(t for t in range(2, 6) if mon.get_tool(t) is None)
    target_ = targets.resolve(target("work"))
    base, monitored, hooked = [], [], []
    for _ in range(rounds):
        base.append(loop_work(n))
        mon.use_tool_id(tool, "bench")
        try:
            mon.register_callback(tool, mon.events.PY_START, on_start)
            mon.register_callback(tool, mon.events.PY_RETURN, on_return)
            mon.set_local_events(tool, work.__code__, mon.events.PY_START | mon.events.PY_RETURN)
            monitored.append(loop_work(n))
        finally:
            mon.set_local_events(tool, work.__code__, 0)
            mon.register_callback(tool, mon.events.PY_START, None)
            mon.register_callback(tool, mon.events.PY_RETURN, None)
            mon.free_tool_id(tool)
        remove = hooks.install(target_, None, lambda token, value, exc, elapsed: sink.clear())
        try:
            hooked.append(loop_work(n))
        finally:
            remove()
    b = min(base)
    return {"sys_monitoring_ratio": round(min(monitored) / b, 2), "code_swap_ratio": round(min(hooked) / b, 2)}


def attached(rounds: int) -> dict[str, Any]:
    """The same scenarios in a separate target process, through a real attached agent."""
    import re
    import subprocess

    from flight_profiler.api import connect

    bench_dir = os.path.dirname(os.path.abspath(__file__))
    code = CHILD.format(src=os.path.join(ROOT, "src"), bench=bench_dir)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    lines = child.stdout

    def sample(kind: str, n: int) -> float:
        got: list[float] = []
        while len(got) < n:
            m = re.match(r"(\w+) ([\d.e-]+)", lines.readline())
            if m and m.group(1) == kind:
                got.append(float(m.group(2)))
        return min(got)

    def spec(method: str, cls: str | None = None) -> dict[str, Any]:
        return {"module": "__main__", "class": cls, "method": method, "nested": None}

    scenarios = {
        "filtered": ("work", "watch", {"target": spec("work"), "filter": "params[0] < 0"}),
        "filtered-cost": ("work", "watch", {"target": spec("work"), "filter": "cost > 1e6"}),
        "reported": ("work", "watch", {"target": spec("work")}),
        "elsewhere": ("work", "watch", {"target": spec("other")}),
        # how much a traced call costs depends on how many the client keeps up with (the rest
        # are dropped before recording): see trace-all / trace-small in-process for one call
        "trace": ("step", "trace", {"target": spec("step", "Model")}),
    }
    figures: dict[str, Any] = {}
    try:
        lines.readline()  # READY
        with connect(child.pid, timeout=60) as session:
            for name, (kind, cmd, args) in scenarios.items():
                base = sample(kind, rounds)
                events: list[int] = []
                client = session._client()
                req = client.start(cmd, args)
                stream = client.messages(req)
                next(stream)  # watching/tracing: the hook is in
                reader = threading.Thread(target=_count_into, args=(stream, events), daemon=True)
                reader.start()
                inst = sample(kind, rounds)
                client.cancel(req)
                reader.join(30)
                figures[name] = {"baseline_us": round(base * 1e6, 3), "instrumented_us": round(inst * 1e6, 3),
                                 "ratio": round(inst / base, 2), "events": len(events)}
            session.detach()
    finally:
        child.kill()
        child.wait(10)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--attach", action="store_true",
                        help="also measure through a real agent attached to a child process")
    opts = parser.parse_args()
    sys.modules.setdefault(__name__, sys.modules["__main__"])
    n_work, n_step, n_small = 20_000, 2_000, 100
    step = target("step", "Model")
    scenarios = {
        "filtered": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work"), "filter": "params[0] < 0"})),
        "filtered-cost": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work"), "filter": "cost > 1e6"})),
        "reported": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work")}, saturate=True)),
        "reported-all": (loop_work, n_work // 4, lambda: InProcessAgent(
            "watch", {"target": target("work")}, unbounded=True)),
        "trace": (loop_step, n_step, lambda: InProcessAgent("trace", {"target": step}, saturate=True)),
        "trace-all": (loop_step, n_step, lambda: InProcessAgent("trace", {"target": step}, unbounded=True)),
        "trace-small": (loop_step_small, n_small, lambda: InProcessAgent(
            "trace", {"target": target("step_small", "Model")}, unbounded=True)),
        "elsewhere": (loop_work, n_work, lambda: InProcessAgent("watch", {"target": target("other")})),
    }
    figures: dict[str, Any] = {"python": sys.version.split()[0]}
    for name, (loop, n, agent) in scenarios.items():
        base, inst, result = measure(loop, n, agent, opts.rounds)
        figures[name] = {
            "baseline_us": round(base * 1e6, 3), "instrumented_us": round(inst * 1e6, 3),
            "ratio": round(inst / base, 2),
            "calls": result.get("calls"), "events": result.get("events"), "dropped": result.get("dropped"),
        }
    figures["observer"] = hook_vs_monitoring(opts.rounds, n_work)
    if opts.attach:
        figures["attached"] = attached(opts.rounds)
    if opts.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"Python {figures['python']}, best of {opts.rounds} alternating rounds")
    for name in scenarios:
        f = figures[name]
        print(f"  {name:13s} {f['baseline_us']:8.3f} us -> {f['instrumented_us']:8.3f} us per call"
              f"   ratio {f['ratio']:.2f}x   (events sent {f['events']}, dropped {f['dropped']})")
    if figures["observer"]:
        o = figures["observer"]
        print(f"  bare observer on `work`: sys.monitoring PY_START/PY_RETURN {o['sys_monitoring_ratio']:.2f}x, "
              f"hooks.py code swap {o['code_swap_ratio']:.2f}x")
    if opts.attach:
        print("through a real attached agent (a child process, its own timings):")
        for name, f in figures["attached"].items():
            print(f"  {name:13s} {f['baseline_us']:8.3f} us -> {f['instrumented_us']:8.3f} us per call"
                  f"   ratio {f['ratio']:.2f}x   (events received {f['events']})")


if __name__ == "__main__":
    main()
