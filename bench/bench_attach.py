"""Attach latency and idle cost of the agent, measured in one run (ratios: machines are noisy).

    /work/venv/bin/python bench/bench_attach.py [--python /path/to/python3.X] [--runs 5]

Prints (and with --json emits) :
- first command on a fresh target (CLI wall time, and the API's attach time);
- a later command on the same target (CLI wall time, API reconnect + request);
- bare `flight_profiler --help`, against `python -c pass` on the same interpreter;
- which heavy modules `--help` and a reconnect import (-X importtime): torch never, rich tables
  only when a table is rendered;
- idle cost: a loop's throughput (iterations per CPU-second) with an idle agent vs without, in
  the same process (attach / detach alternating), relative to a control process alongside.
- injection methods side by side in one run: the built-in ptrace injector against gdb (a gdb
  that passes the self-test, given with --gdb or $FLIGHT_PROFILER_GDB; e.g. gdb 18 from the
  PyPI package gdb-for-pwndbg), on a sleeping and a busy target, as a ratio; with
  --baseline-src OTHER/src, against another checkout's ptrace injector too (the cost of a
  change, e.g. of the self-restoring calls: --only-methods --baseline-src ../main/src).
Targets (issue 9): first command < 0.2 s, later < 0.1 s; the closest peer measured 0.66 s / 0.12 s
on this machine kind (its own ptrace shellcode), gdb 18 0.27 s / 0.086 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from flight_profiler.api import connect  # noqa: E402

CLI = [sys.executable, "-m", "flight_profiler"]

SLEEPER = r"""
import os, time
os.write(1, b"READY\n")
while True:
    time.sleep(0.05)
"""

# Counts loop iterations; every 0.25 s prints the count, the wall clock and its own CPU time
# (iterations per CPU-second barely move when other processes compete for the cores).
SPINNER = r"""
import os, time
os.write(1, b"READY\n")
n = 0
last = time.monotonic()
while True:
    for i in range(1000):
        n += 1
    now = time.monotonic()
    if now - last >= 0.25:
        os.write(1, f"n {n} {now} {time.process_time()}\n".encode())
        last = now
"""


def spawn(python: str, code: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = Path(tempfile.mkstemp(prefix="fp-bench-", suffix=".out")[1])
    with open(out, "wb") as f:
        proc = subprocess.Popen([python, "-c", code], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while b"READY" not in out.read_bytes():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"target did not start: {out.read_text()}")
        time.sleep(0.01)
    return proc, out


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


CPU: list[float] = []  # CPU seconds (user+sys) of each timed command and its children (gdb)


def wall(argv: list[str]) -> float:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return elapsed


def timed(argv: list[str], cpu: list[float]) -> float:
    elapsed = wall(argv)
    cpu.append(CPU[-1])
    return elapsed


def idle_cpu_ticks(pid: int, seconds: float) -> int:
    """CPU ticks (user+sys) the process used during ``seconds``."""
    def ticks() -> int:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    start = ticks()
    time.sleep(seconds)
    return ticks() - start


def imported(argv: list[str]) -> set[str]:
    """Modules imported by a CLI run, from -X importtime."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], capture_output=True,
                          text=True, timeout=120)
    return {m.group(1).strip() for m in re.finditer(r"\|\s+([\w.]+)\s*$", proc.stderr, re.M)}


def median_ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(values) * 1000, 1),
            "min_ms": round(min(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1)}


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0])


def bench_latency(python: str, runs: int) -> dict[str, object]:
    first_cli, first_api, later_cli, later_api = [], [], [], []
    first_cpu: list[float] = []
    later_cpu: list[float] = []
    rss_delta: list[float] = []
    idle_before: list[int] = []
    idle_after: list[int] = []
    for _ in range(runs):
        proc, _ = spawn(python, SLEEPER)
        try:
            before = rss_kb(proc.pid)
            idle_before.append(idle_cpu_ticks(proc.pid, 2.0))
            first_cli.append(timed([*CLI, str(proc.pid), "--cmd", "status", "--json"], first_cpu))
            rss_delta.append(rss_kb(proc.pid) - before)
            idle_after.append(idle_cpu_ticks(proc.pid, 2.0))
            for _ in range(3):
                later_cli.append(timed([*CLI, str(proc.pid), "--cmd", "status", "--json"],
                                       later_cpu))
            for _ in range(5):
                start = time.perf_counter()
                with connect(proc.pid) as session:
                    session.request("status")
                later_api.append(time.perf_counter() - start)
            with connect(proc.pid) as session:
                session.detach()
            time.sleep(0.05)
            start = time.perf_counter()
            with connect(proc.pid, timeout=15) as session:
                assert session.injected
                session.request("status")
            first_api.append(time.perf_counter() - start)
        finally:
            stop(proc)
    return {
        "first_command_cli": median_ms(first_cli),
        "first_command_api": median_ms(first_api),
        "later_command_cli": median_ms(later_cli),
        "later_command_api": median_ms(later_api),
        "first_command_cli_cpu_ms (CLI + gdb, user+sys)": round(statistics.median(first_cpu) * 1000, 1),
        "later_command_cli_cpu_ms": round(statistics.median(later_cpu) * 1000, 1),
        "target_rss_growth_kb_after_first_command": statistics.median(rss_delta),
        "sleeping_target_cpu_ticks_per_2s (no agent, idle agent)": (
            sum(idle_before), sum(idle_after)),
    }


TORCH_SLEEPER = "import torch\n" + SLEEPER


def bench_torch_target(runs: int) -> dict[str, object]:
    """First command on a target that imported torch (hundreds of MB of shared libraries)."""
    try:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return {"skipped": "torch is not installed for " + sys.executable}
    except ValueError:
        return {"skipped": "torch not importable"}
    first = []
    for _ in range(runs):
        proc, _ = spawn(sys.executable, TORCH_SLEEPER)
        try:
            first.append(wall([*CLI, str(proc.pid), "--cmd", "status", "--json"]))
        finally:
            stop(proc)
    return {"first_command_cli_torch_target": median_ms(first)}


def bench_startup(runs: int) -> dict[str, object]:
    helps = [wall([*CLI, "--help"]) for _ in range(runs)]
    bare = [wall([sys.executable, "-c", "pass"]) for _ in range(runs)]
    return {"help": median_ms(helps), "python_-c_pass": median_ms(bare),
            "help_over_bare_python": round(statistics.median(helps) / statistics.median(bare), 2)}


def bench_imports(python: str) -> dict[str, object]:
    heavy = ("torch", "numpy", "rich", "rich.table", "rich.console", "flight_profiler.report",
             "flight_profiler.attach.gdb")
    help_mods = imported([*CLI, "--help"])
    proc, _ = spawn(python, SLEEPER)
    try:
        wall([*CLI, str(proc.pid), "--cmd", "status"])
        json_mods = imported([*CLI, str(proc.pid), "--cmd", "stack", "--json"])
        rich_mods = imported([*CLI, str(proc.pid), "--cmd", "stack"])
        with connect(proc.pid) as session:
            session.detach()
    finally:
        stop(proc)
    return {
        "help_imports": sorted(m for m in heavy if m in help_mods),
        "reconnect_json_imports": sorted(m for m in heavy if m in json_mods),
        "reconnect_rendered_imports": sorted(m for m in heavy if m in rich_mods),
    }


def _counts(out: Path) -> list[tuple[int, float, float]]:
    return [(int(a), float(b), float(c))
            for a, b, c in re.findall(r"^n (\d+) ([\d.]+) ([\d.]+)$", out.read_text(), re.M)]


def _rate(out: Path, t0: float, t1: float) -> float:
    """Loop iterations per CPU-second of the target between wall times t0 and t1."""
    points = [p for p in _counts(out) if t0 <= p[1] <= t1]
    if len(points) < 2:
        return float("nan")
    (n0, _, c0), (n1, _, c1) = points[0], points[-1]
    return (n1 - n0) / (c1 - c0)


def bench_idle(python: str, seconds: float, rounds: int) -> dict[str, object]:
    """Idle cost: one spinner alternates without / with an idle agent (attach, then detach),
    measured against a second spinner running alongside that never gets an agent.

    Each "with agent" window is compared with the mean of the two "without" windows around it,
    all as the ratio A/control of iterations per CPU-second, so that load changing over time
    and differences between the two processes cancel out. 1.0 means an idle agent costs
    nothing; the spread of the rounds shows the noise floor of the machine.
    """
    a, out_a = spawn(python, SPINNER)
    c, out_c = spawn(python, SPINNER)

    def window() -> float:
        time.sleep(0.3)
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
        return _rate(out_a, t0, t1) / _rate(out_c, t0, t1)

    ratios = []
    try:
        before = window()
        for _ in range(rounds):
            with connect(a.pid, timeout=15):
                pass  # the agent stays, idle
            with_agent = window()
            with connect(a.pid) as session:
                session.detach()
            after = window()
            ratios.append(with_agent / ((before + after) / 2))
            before = after
    finally:
        stop(a)
        stop(c)
    return {"throughput_ratio_idle_agent_over_none": round(statistics.geometric_mean(ratios), 4),
            "rounds": [round(x, 4) for x in ratios]}


BUSY = r"""
import os
os.write(1, b"READY\n")
x = 0
while True:
    for i in range(1000):
        x += i
"""


def bench_methods(python: str, runs: int, gdb: str | None,
                  baseline: str | None = None) -> dict[str, object]:
    """First command per injection method, each on a fresh target, interleaved run by run.

    ``baseline``: the src directory of another checkout, whose ptrace injector runs as a third
    method ("ptrace@baseline") in the same rounds: a change's cost as a ratio of one run.
    """
    methods = ["ptrace"] + (["gdb"] if gdb else []) + (["ptrace@baseline"] if baseline else [])
    env = dict(os.environ)
    if gdb:
        env["FLIGHT_PROFILER_GDB"] = gdb
    out: dict[str, object] = {}
    for name, code in (("sleeping", SLEEPER), ("busy", BUSY)):
        times: dict[str, list[float]] = {m: [] for m in methods}
        injector: dict[str, list[float]] = {m: [] for m in methods}  # its own time, from -v
        for _ in range(runs):
            for method in methods:
                proc, _ = spawn(python, code)
                run_env = dict(env, PYTHONPATH=baseline) if method.endswith("@baseline") else env
                try:
                    start = time.perf_counter()
                    done = subprocess.run([*CLI, str(proc.pid), "--cmd", "status", "--timeout", "60", "--method",
                                           method.split("@")[0], "-v"], check=True,
                                          capture_output=True, text=True, timeout=120,
                                          env=run_env)
                    times[method].append(time.perf_counter() - start)
                    m = re.search(r"\w+ returned in ([\d.]+)s", done.stderr)
                    if m:
                        injector[method].append(float(m.group(1)))
                    assert proc.poll() is None, "target died"
                finally:
                    stop(proc)
        row: dict[str, object] = {m: median_ms(v) for m, v in times.items()}
        row["injector_alone"] = {m: median_ms(v) for m, v in injector.items() if v}
        if gdb:
            row["ptrace_over_gdb"] = round(statistics.median(times["ptrace"])
                                           / statistics.median(times["gdb"]), 2)
        if baseline:
            row["ptrace_over_baseline"] = round(statistics.median(times["ptrace"]) /
                                                statistics.median(times["ptrace@baseline"]), 3)
            if injector["ptrace"] and injector["ptrace@baseline"]:
                row["injector_alone_ptrace_over_baseline"] = round(
                    statistics.median(injector["ptrace"])
                    / statistics.median(injector["ptrace@baseline"]), 3)
        out[name] = row
    if not gdb:
        out["gdb"] = "skipped: no working gdb given (--gdb PATH or $FLIGHT_PROFILER_GDB)"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "/root/.pyenv/versions/3.11.7/bin/python3.11"
    parser.add_argument("--python", default=default if os.path.exists(default) else sys.executable)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=2.0)
    parser.add_argument("--idle-rounds", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gdb", default=os.environ.get("FLIGHT_PROFILER_GDB"),
                        help="a working gdb to compare the built-in injector with")
    parser.add_argument("--baseline-src", help="another checkout's src/: its ptrace injector "
                        "runs beside this one's, interleaved (the cost of a change)")
    parser.add_argument("--only-methods", action="store_true",
                        help="run only the injection methods' comparison")
    args = parser.parse_args()
    if args.only_methods:
        print(json.dumps({"target_python": args.python, "methods": bench_methods(
            args.python, args.runs, args.gdb, args.baseline_src)}, indent=2))
        return
    results = {
        "target_python": args.python,
        "methods": bench_methods(args.python, args.runs, args.gdb, args.baseline_src),
        "latency": bench_latency(args.python, args.runs),
        "torch_target": bench_torch_target(max(args.runs // 2, 1)),
        "startup": bench_startup(args.runs),
        "imports": bench_imports(args.python),
        "idle": bench_idle(args.python, args.idle_seconds, args.idle_rounds),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    lat = results["latency"]
    print(f"target: {args.python}")
    for state, row in results["methods"].items():  # type: ignore[union-attr]
        print(f"first command, {state} target, by method: {row}")
    for key, value in lat.items():  # type: ignore[union-attr]
        if isinstance(value, dict):
            print(f"{key:22s} median {value['median_ms']:7.1f} ms  "
                  f"(min {value['min_ms']}, max {value['max_ms']})")
        else:
            print(f"{key}: {value}")
    for key, value in results["torch_target"].items():  # type: ignore[union-attr]
        if isinstance(value, dict):
            print(f"{key:22s} median {value['median_ms']:7.1f} ms  "
                  f"(min {value['min_ms']}, max {value['max_ms']})")
        else:
            print(f"{key}: {value}")
    st = results["startup"]
    print(f"--help                 median {st['help']['median_ms']:7.1f} ms  "  # type: ignore[index]
          f"(python -c pass {st['python_-c_pass']['median_ms']} ms, "  # type: ignore[index]
          f"ratio {st['help_over_bare_python']})")  # type: ignore[index]
    for key, value in results["imports"].items():  # type: ignore[union-attr]
        print(f"{key:28s} heavy modules: {', '.join(value) or 'none'}")
    idle = results["idle"]
    print(f"idle agent throughput ratio {idle['throughput_ratio_idle_agent_over_none']} "  # type: ignore[index]
          f"(rounds {idle['rounds']})")  # type: ignore[index]


if __name__ == "__main__":
    main()
