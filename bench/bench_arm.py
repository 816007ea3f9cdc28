"""Cost of armed and idle triggers (`arm --on hang/nan/oom`) on a training loop, CPU.

    .venv/bin/python bench/bench_arm.py [--rounds 7] [--seconds 1.5] [--json]

Two loops, each a plain ``zero_grad / forward / backward / optimizer.step()``: one of small ops
(a step of about a millisecond, where a fixed per-step cost shows most) and one of big matmuls
(Linear(1024, 1024) x 3, batch 128, one thread). In each round the same loop runs for ``--seconds`` plain
and for ``--seconds`` with every trigger armed (hang 600 s with its watcher thread, nan with
its paced gradient check after each optimizer step, oom with an RSS limit and the chained
excepthooks), in alternating order; the figure is the median over rounds of the armed step
rate over the plain one, measured side by side in one run (a shared, loaded machine changes
both alike). The figure is by CPU time of the whole process (``time.process_time``: the
training thread and the watcher both count) per step, which a process descheduled by other
load does not inflate; wall time per step is shown beside it. The median round is the figure.
Also: what the NaN check itself costs when it runs, and how often it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from flight_profiler.agent.registry import AgentState  # noqa: E402
from flight_profiler.agent.triggers.armory import Armory  # noqa: E402
from flight_profiler.agent.triggers.base import Trigger  # noqa: E402
from flight_profiler.agent.triggers.evidence import EvidenceDir  # noqa: E402
from flight_profiler.agent.triggers.hang import HangTrigger  # noqa: E402
from flight_profiler.agent.triggers.nan import NanTrigger  # noqa: E402
from flight_profiler.agent.triggers.oom import OomTrigger  # noqa: E402


def loop(kind: str) -> Callable[[], None]:
    if kind == "small":
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                    torch.nn.ReLU(), torch.nn.Linear(128, 1))
        x = torch.randn(32, 64)
    else:
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(3)])
        x = torch.randn(128, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)

    def step() -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    step.model = model  # type: ignore[attr-defined]
    return step


def run_block(step: Callable[[], None], seconds: float, min_steps: int) -> tuple[float, float]:
    """(CPU seconds of the whole process per step, wall seconds per step) over ``seconds`` and
    at least ``min_steps`` steps."""
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while True:
        step()
        n += 1
        t1 = time.perf_counter()
        if t1 - t0 >= seconds and n >= min_steps:
            return (time.process_time() - c0) / n, (t1 - t0) / n


KINDS = ("hang", "nan", "oom")


def arm_all(out: str, kinds: tuple[str, ...] = KINDS) -> tuple[Armory, NanTrigger | None]:
    armory, state = Armory(), AgentState()
    nan = NanTrigger(EvidenceDir(out, 1 << 30), 1, {}) if "nan" in kinds else None
    if "hang" in kinds:
        armory.arm(HangTrigger(EvidenceDir(out, 1 << 30), 1, {}, seconds=600.0), state, None)
    if nan is not None:
        armory.arm(nan, state, None)
    if "oom" in kinds:
        armory.arm(OomTrigger(EvidenceDir(out, 1 << 30), 1, {}, rss_limit=1 << 45), state, None)
    return armory, nan


def measure(kind: str, rounds: int, seconds: float, out: str,
            kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    step = loop(kind)
    for _ in range(20):
        step()
    cpu_ratios, wall_ratios, plain_cpu, nan_docs = [], [], [], []
    watcher_share: list[float] = []  # the watcher thread's CPU seconds per wall second
    min_steps = 200 if kind == "small" else 12
    armed_cpu: list[float] = []
    for r in range(-1, rounds):  # round -1 warms both up (allocator, first arm) and is not kept
        plain_first = r % 2 == 0
        if plain_first:
            plain = run_block(step, seconds, min_steps)
        armory, nan = arm_all(out, kinds)
        for _ in range(3):  # steady state: the first check warms torch's kernels up (once per arm)
            step()
        watcher = armory._thread
        clk = time.pthread_getcpuclockid(watcher.ident) if watcher and watcher.ident else None
        w0, t0 = (time.clock_gettime(clk) if clk is not None else 0.0), time.perf_counter()
        armed = run_block(step, seconds, min_steps)
        if clk is not None:
            watcher_share.append((time.clock_gettime(clk) - w0) / (time.perf_counter() - t0))
        nan_docs.append(nan.detail() if nan is not None else {})
        armory.disarm()
        if not plain_first:
            plain = run_block(step, seconds, min_steps)
        if r < 0:
            nan_docs.clear()
            watcher_share.clear()
            continue
        # step rate armed / plain = time per step plain / armed
        cpu_ratios.append(plain[0] / armed[0])
        wall_ratios.append(plain[1] / armed[1])
        plain_cpu.append(plain[0])
        armed_cpu.append(armed[0])
    cpu = statistics.median(cpu_ratios)
    # the least disturbed block of each kind: on a loaded machine other processes only ever add
    # CPU time per step (cache and core sharing), so the minima are the steadiest comparison
    best = min(plain_cpu) / min(armed_cpu)
    last = nan_docs[-1]
    return {"loop": kind, "armed": "+".join(kinds), "plain_step_cpu_ms": round(1000 * statistics.median(plain_cpu), 3),
            "armed_over_plain_rate_cpu": round(cpu, 4), "cost_pct": round(100 * (1 - cpu), 2),
            "best_over_best_rate_cpu": round(best, 4), "best_cost_pct": round(100 * (1 - best), 2),
            "armed_over_plain_rate_wall": round(statistics.median(wall_ratios), 4),
            "rounds": rounds,
            "watcher_cpu_pct": round(100 * statistics.median(watcher_share), 4) if watcher_share else None,
            "nan_check_ms": last.get("check_ms"), "nan_checked_every": last.get("every"),
            "nan_checks": last.get("checks")}


def fixed_cost(out: str, calls: int = 20000, rounds: int = 9) -> dict[str, Any]:
    """The per-step cost of the armed hooks alone: ``optimizer.step()`` of a one-scalar SGD
    (its own work is next to nothing), CPU time per call armed and plain, alternated."""
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)

    def block() -> float:
        c0 = time.process_time()
        for _ in range(calls):
            opt.step()
        return (time.process_time() - c0) / calls

    plain, armed = [], []
    for _ in range(rounds):
        plain.append(block())
        armory, _nan = arm_all(out)
        armed.append(block())
        armory.disarm()
    p, a = min(plain), min(armed)  # least disturbed: load only adds
    return {"plain_step_call_us": round(1e6 * p, 2), "armed_step_call_us": round(1e6 * a, 2),
            "hooks_us_per_step": round(1e6 * (a - p), 2)}


class _ClockOnly(Trigger):
    """Nothing but the step clock's hooks: what every step trigger shares."""

    kind = "clock"
    needs_clock = True


PART_SETS: dict[str, tuple[str, ...]] = {
    "clock": ("clock",), "hang": ("hang",), "nan": ("nan",), "oom": ("oom",), "all": KINDS}


def arm_part(out: str, kinds: tuple[str, ...]) -> tuple[Armory, NanTrigger | None]:
    if kinds != ("clock",):
        return arm_all(out, kinds)
    armory = Armory()
    armory.arm(_ClockOnly(EvidenceDir(out, 1 << 30), 1, {}), AgentState(), None)
    return armory, None


def _trimmed_mean(values: list[float], cut: float = 0.2) -> float:
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    kept = ordered[k:len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def parts(kind: str, pairs: int, block_s: float, out: str) -> list[dict[str, Any]]:
    """Each part armed alone, in short plain/armed block pairs interleaved across the parts
    (part A's pair, part B's pair, ..., again), so that a change of load on the shared machine
    falls on every part alike. Per pair: plain CPU per step / armed CPU per step (whole
    process: the watcher counts); the figure is the trimmed mean of the pairs' costs (20 % cut
    each side) with the pooled cost (all armed CPU over all plain CPU) beside it."""
    step = loop(kind)
    for _ in range(50):
        step()
    min_steps = 20
    costs: dict[str, list[float]] = {name: [] for name in PART_SETS}
    pooled: dict[str, list[float]] = {name: [0.0, 0.0] for name in PART_SETS}
    every: dict[str, list[int]] = {name: [] for name in PART_SETS}
    least: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name in PART_SETS}
    for r in range(pairs):
        for name, kinds in PART_SETS.items():
            plain_first = r % 2 == 0
            if plain_first:
                plain = run_block(step, block_s, min_steps)[0]
            armory, nan = arm_part(out, kinds)
            # the NaN check's first (cold) runs and its pacing settle: an armed trigger's idle cost
            # is its steady state (three steps were too few: each short pair then measured the
            # arming transient, +2.9 % on the small loop where the steady state reads 0.0 %)
            settle = time.perf_counter() + 0.5
            while (nan is not None and nan.checks < 4) or time.perf_counter() < settle:
                step()
            armed = run_block(step, block_s, min_steps)[0]
            if nan is not None:
                every[name].append(nan.every)
            armory.disarm()
            if not plain_first:
                plain = run_block(step, block_s, min_steps)[0]
            costs[name].append(1 - plain / armed)
            pooled[name][0] += plain
            pooled[name][1] += armed
            least[name] = [min(least[name][0], plain), min(least[name][1], armed)]
    return [{"loop": kind, "part": name, "pairs": pairs,
             "cost_pct_trimmed_mean": round(100 * _trimmed_mean(costs[name]), 3),
             "cost_pct_median": round(100 * statistics.median(costs[name]), 3),
             "cost_pct_pooled": round(100 * (1 - pooled[name][0] / pooled[name][1]), 3),
             # the least disturbed block of each side: load on a shared machine only adds
             "cost_pct_least": round(100 * (1 - least[name][0] / least[name][1]), 3),
             "nan_every_median": statistics.median(every[name]) if every[name] else None}
            for name in PART_SETS]


def located_cost(kind: str, out: str, repeats: int = 5) -> dict[str, Any]:
    """The step after a NaN fires, watched op by op (nan_locate.py): its time over a plain
    step's (the median of the 20 steps before the fire), each repeat on a fresh model."""
    ratios = []
    for r in range(repeats):
        step = loop(kind)
        armory = Armory()
        trigger = NanTrigger(EvidenceDir(f"{out}/located-{kind}-{r}", 1 << 30), 1, {})
        armory.arm(trigger, AgentState(), None)
        try:
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            first = next(step.model.parameters())  # type: ignore[attr-defined]
            first.register_hook(lambda g: g.fill_(float("nan")))  # poisoned gradients from now on
            for _ in range(2000):
                step()
                if trigger.fires:
                    break
            t0 = time.perf_counter()
            step()  # the watched one
            watched = time.perf_counter() - t0
            ratios.append(watched / statistics.median(times))
        finally:
            armory.disarm()
    return {"loop": kind, "watched_over_plain_step": round(statistics.median(ratios), 1),
            "ratios": [round(x, 1) for x in ratios]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--each", action="store_true",
                        help="also each trigger armed alone (where the cost is)")
    parser.add_argument("--loops", default="small,big", help="small,big (default both)")
    parser.add_argument("--parts", type=int, default=0, metavar="PAIRS",
                        help="instead: each part (clock hooks, hang, nan, oom, all) alone, PAIRS "
                             "short interleaved plain/armed block pairs each")
    parser.add_argument("--block", type=float, default=0.15, help="--parts: seconds per block")
    parser.add_argument("--located", action="store_true",
                        help="instead: the cost of the step watched op by op after a NaN fires")
    args = parser.parse_args()
    if args.located:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="fp-bench-arm-") as tmp:
            for kind in args.loops.split(","):
                row = located_cost(kind, tmp)
                print(f"{row['loop']:>5} loop: the watched step took {row['watched_over_plain_step']}x a "
                      f"plain step (median of {len(row['ratios'])}: {row['ratios']})")
        return
    if args.parts:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="fp-bench-arm-") as tmp:
            rows = [row for kind in args.loops.split(",")
                    for row in parts(kind, args.parts, args.block, tmp)]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                print(f"{row['loop']:>5} loop, {row['part']:>5}: cost {row['cost_pct_trimmed_mean']} % "
                      f"(trimmed mean of {row['pairs']} pairs; median {row['cost_pct_median']} %, "
                      f"pooled {row['cost_pct_pooled']} %, least disturbed blocks {row['cost_pct_least']} %)"
                      + (f"; NaN check one step in {row['nan_every_median']}" if row["nan_every_median"] else ""))
        return
    sets = [(k,) for k in KINDS] + [KINDS] if args.each else [KINDS]
    torch.set_num_threads(1)  # one core each: the machine is shared; ratios stay comparable
    with tempfile.TemporaryDirectory(prefix="fp-bench-arm-") as tmp:
        results = [measure(kind, args.rounds, args.seconds, tmp, kinds)
                   for kind in args.loops.split(",") for kinds in sets]
        fixed = fixed_cost(tmp)
    if args.json:
        print(json.dumps({"loops": results, "fixed": fixed}, indent=2))
        return
    print(f"armed hooks per optimizer.step(): {fixed['hooks_us_per_step']} us CPU "
          f"({fixed['plain_step_call_us']} us plain call of a one-scalar SGD step, "
          f"{fixed['armed_step_call_us']} us armed; includes the paced NaN check)")
    for res in results:
        print(f"{res['loop']:>5} loop, {res['armed']:>12}: {res['plain_step_cpu_ms']} ms CPU per step plain; armed/plain "
              f"step rate {res['armed_over_plain_rate_cpu']} by CPU time (cost {res['cost_pct']} %), "
              f"least disturbed blocks {res['best_over_best_rate_cpu']} (cost {res['best_cost_pct']} %), "
              f"{res['armed_over_plain_rate_wall']} by wall time (noisy when the machine is shared); "
              f"watcher thread {res['watcher_cpu_pct']} % of a core; "
              f"NaN check {res['nan_check_ms']} ms, on one step in {res['nan_checked_every']}")


if __name__ == "__main__":
    main()
