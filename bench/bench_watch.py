"""Overhead of watch and trace, as ratios measured in one run (machines are shared and noisy).

    python bench/bench_watch.py            # in-process agent: handler thread + the same hooks
    python bench/bench_watch.py --attach   # also through a real attached agent (a target child)
    python bench/bench_watch.py --pythons all --before main   # a table: every installed CPython,
                                           # the code of git revision `main` against this checkout

Each scenario alternates its baseline and instrumented runs several times and compares the best
(minimum) times, so a burst of noise from other processes cannot masquerade as overhead. Time is
the PROCESS's CPU time (time.process_time): what the target pays, the agent's own threads (the
handler that renders and sends events) included, and immune to other processes on the machine.
``--before REV`` runs the same scenarios, in their own processes, on the agent of git revision
REV (``git archive`` of its src/ into a temporary directory): each figure is still a ratio taken
in one run, so before and after compare even on a loaded machine.

Scenarios (the peer's figures, measured on this kind of machine, in shared/design/peers.md):
  filtered      `work` (~1 us) watched with a filter on its arguments that never matches:
                decided on entry, written into the wrapper itself        (peer 7-10x)
  filtered-call the same with a filter that calls something (`abs(params[0]) < 0`): it runs
                as a callback (and under the depth guard), as several hooks on one function do
  filtered-cost the same with a filter on `cost` (decided on exit: every call is timed)
  step-filtered `step_small`, a method making 50 calls of `work`, while `work` is watched with
                a never-matching filter: the issue's measurement, as the step's ratio
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
  (the -all and -small figures run the command with -n N and count the process's CPU until
  the N events are sent: the handler's and sender's work, trace's tree building included)
  elsewhere     `work` while a watch is active on another function           (should be 1.00x)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _src_dir() -> str:
    """--src DIR picks the flight_profiler to measure (before anything imports it)."""
    if "--src" in sys.argv:
        return os.path.abspath(sys.argv[sys.argv.index("--src") + 1])
    return os.path.join(ROOT, "src")


SRC = _src_dir()
sys.path.insert(0, SRC)

from flight_profiler.agent import protocol, registry  # noqa: E402
from flight_profiler.agent.commands import trace as trace_mod  # noqa: E402
from flight_profiler.agent.commands import watch as watch_mod  # noqa: E402
from flight_profiler.agent.outbox import Outbox  # noqa: E402
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
    """A handler thread running one command; its events go through the agent's own outbox (the
    sender thread, encoding, batched writes) into /dev/null, as they would into a socket."""

    def __init__(self, cmd: str, args: dict[str, Any], unbounded: bool = False,
                 saturate: bool = False, drain: int = 0) -> None:
        """``drain`` N: the command ends by itself after N calls (-n) and the measurement
        waits for it, so what the handler and sender threads do with those calls (trace builds
        its trees there, every event is encoded and written) is in the figure too."""
        if drain:
            args = dict(args, count=drain)
        self.unbounded = unbounded
        self.drain = drain
        self.saturate = saturate
        self.sink = os.open(os.devnull, os.O_WRONLY)
        self.events = 0
        try:
            self.outbox = Outbox(self._send, 1, "bench-events", limit=10**9,
                                 encode=protocol.encode, send_bytes=self._write)
        except TypeError:  # an agent from before batched writes: one write per event
            self.outbox = Outbox(self._send, 1, "bench-events", limit=10**9)
        self.ctx = Context(args, emit=self._emit)
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(cmd,), daemon=True)

    def _emit(self, data: dict[str, Any]) -> None:
        self.events += 1
        self.outbox.emit(data)

    def _send(self, message: dict[str, Any]) -> None:
        self._write(protocol.encode(message))

    def _write(self, data: bytes) -> None:
        os.write(self.sink, data)

    def _run(self, cmd: str) -> None:
        try:
            self.result = registry.run(self.ctx, cmd)
        finally:
            self.outbox.flush()

    def __enter__(self) -> InProcessAgent:
        if self.unbounded:
            watch_mod.QUEUE_MAX = trace_mod.QUEUE_MAX = 10**9
        self.thread.start()
        time.sleep(0.05)  # the hook is installed well before the measurement
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.cancel()
        self.thread.join(60)
        os.close(self.sink)
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
            if a.drain:  # the loop, then the command's own threads until all is sent
                started = time.process_time()
                loop(n)
                a.thread.join(60)
                inst.append(time.process_time() - started)
            else:
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
    print("small", b.loop_step_small(200) / 200, flush=True)
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
    code = CHILD.format(src=SRC, bench=bench_dir)
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
        # issue 23's measurement: a method making 50 calls of `work`, `work` watched
        "step-filtered": ("small", "watch", {"target": spec("work"), "filter": "params[0] < 0"}),
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


def interpreters(wanted: str) -> dict[str, str]:
    """Installed CPythons by major.minor: ``all`` or a comma list (``3.9,3.12``)."""
    found: dict[str, str] = {}
    for minor in range(9, 15):
        version = f"3.{minor}"
        hits = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
        if hits:
            found[version] = hits[-1]
    if wanted != "all":
        found = {v: p for v, p in found.items() if v in wanted.split(",")}
    return found


def export_revision(rev: str, into: str) -> str:
    """src/ of git revision ``rev``, unpacked under ``into``; returns its path."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "src"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def table(opts: argparse.Namespace) -> None:
    """Every scenario's ratio per interpreter, before (``--before``) and after, each a ratio
    measured in its own run of this script."""
    pythons = interpreters(opts.pythons)
    trees = {"after": SRC}
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        if opts.before:
            trees = {"before": export_revision(opts.before, tmp), "after": SRC}
        runs: dict[tuple[str, str], dict[str, Any]] = {}
        for _ in range(opts.repeat):  # before and after alternate: load hits both alike
            for version, python in pythons.items():
                for label, src in trees.items():
                    cmd = [python, os.path.abspath(__file__), "--json", "--src", src,
                           "--rounds", str(opts.rounds)] + (["--only", opts.only] if opts.only else [])
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    figures = json.loads(out)
                    best = runs.setdefault((version, label), figures)
                    for name, figure in figures.items():
                        if isinstance(figure, dict) and "ratio" in figure:
                            best[name] = min(best[name], figure, key=lambda f: f["ratio"])
    names = [n for n in next(iter(runs.values())) if n not in ("python", "observer")]
    columns = [(v, label) for v in pythons for label in trees]
    if opts.json:
        print(json.dumps({f"{v} {label}": runs[(v, label)] for v, label in columns}, indent=1))
        return
    what = f"before = {opts.before}, after = this checkout" if opts.before else "this checkout"
    print(f"ratios, best of {opts.rounds} alternating rounds per figure, best of {opts.repeat} "
          f"runs ({what})")
    print(f"  {'':14s}" + "".join(f"{v + (' ' + label if opts.before else ''):>14s}" for v, label in columns))
    for name in names:
        print(f"  {name:14s}" + "".join(f"{runs[c][name]['ratio']:13.2f}x" for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--attach", action="store_true",
                        help="also measure through a real agent attached to a child process")
    parser.add_argument("--only", default="", help="comma list of the scenarios to run")
    parser.add_argument("--src", default=SRC, help="the flight_profiler source tree to measure")
    parser.add_argument("--pythons", default="",
                        help="run under these installed CPythons (all, or 3.9,3.12,...) and print a table")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --pythons/--before: runs per figure, alternating, best kept")
    parser.add_argument("--before", default="",
                        help="also measure git revision BEFORE's agent, side by side (with --pythons; "
                             "default: the running interpreter)")
    opts = parser.parse_args()
    if opts.pythons or opts.before:
        opts.pythons = opts.pythons or f"{sys.version_info[0]}.{sys.version_info[1]}"
        table(opts)
        return
    sys.modules.setdefault(__name__, sys.modules["__main__"])
    n_work, n_step, n_small = 20_000, 2_000, 100
    step = target("step", "Model")
    scenarios = {
        "filtered": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work"), "filter": "params[0] < 0"})),
        "filtered-call": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work"), "filter": "abs(params[0]) < 0"})),
        "filtered-cost": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work"), "filter": "cost > 1e6"})),
        "step-filtered": (loop_step_small, n_small * 4, lambda: InProcessAgent(
            "watch", {"target": target("work"), "filter": "params[0] < 0"})),
        "reported": (loop_work, n_work, lambda: InProcessAgent(
            "watch", {"target": target("work")}, saturate=True)),
        "reported-all": (loop_work, n_work // 4, lambda: InProcessAgent(
            "watch", {"target": target("work")}, unbounded=True, drain=n_work // 4)),
        "trace": (loop_step, n_step, lambda: InProcessAgent("trace", {"target": step}, saturate=True)),
        "trace-all": (loop_step, n_step, lambda: InProcessAgent(
            "trace", {"target": step}, unbounded=True, drain=n_step)),
        "trace-small": (loop_step_small, n_small, lambda: InProcessAgent(
            "trace", {"target": target("step_small", "Model")}, unbounded=True, drain=n_small)),
        "elsewhere": (loop_work, n_work, lambda: InProcessAgent("watch", {"target": target("other")})),
    }
    if opts.only:
        scenarios = {n: v for n, v in scenarios.items() if n in opts.only.split(",")}
    figures: dict[str, Any] = {"python": sys.version.split()[0]}
    for name, (loop, n, agent) in scenarios.items():
        base, inst, result = measure(loop, n, agent, opts.rounds)
        figures[name] = {
            "baseline_us": round(base * 1e6, 3), "instrumented_us": round(inst * 1e6, 3),
            "ratio": round(inst / base, 2),
            "calls": result.get("calls"), "events": result.get("events"), "dropped": result.get("dropped"),
        }
    figures["observer"] = hook_vs_monitoring(opts.rounds, n_work) if not opts.only else {}
    if opts.attach:
        figures["attached"] = attached(opts.rounds)
    if opts.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"Python {figures['python']}, best of {opts.rounds} alternating rounds ({SRC})")
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
