"""Idle cost of `arm --on slow FACTOR` (armed, never firing) on a training loop, CPU.

    .venv/bin/python bench/bench_arm_slow.py [--rounds 9] [--seconds 1.0] [--json]

The slow trigger has no hook of its own: it listens to the step clock's post-step hook, which
every step-driven trigger shares (nan, hang's step count). So two figures:

* per ``optimizer.step()`` of a one-scalar SGD (its own work next to nothing), CPU time per
  call plain, with the step clock alone (a listener that does nothing), and with the slow
  trigger: the clock's cost and the slow listener's own (an append and a compare; a sort of
  101 step times every 10 steps);
* the small-op loop of bench_arm.py (a step of about a millisecond, where a fixed per-step
  cost shows most): armed/plain step rate by the process's CPU time, rounds alternated, the
  median round the figure (wall time beside it, noisy on a shared machine).

FACTOR is 1000 so that it never fires: the idle cost, not the profile's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))
sys.path.insert(0, str(BENCH))

import torch  # noqa: E402
from bench_arm import loop, run_block  # noqa: E402

from flight_profiler.agent.registry import AgentState  # noqa: E402
from flight_profiler.agent.triggers.armory import Armory  # noqa: E402
from flight_profiler.agent.triggers.base import Trigger  # noqa: E402
from flight_profiler.agent.triggers.evidence import EvidenceDir  # noqa: E402
from flight_profiler.agent.triggers.slow import SlowTrigger  # noqa: E402


class ClockOnly(Trigger):
    """A listener of the step clock that does nothing: the clock's own cost."""

    kind = "clock"
    needs_clock = True


def armed(out: str, what: str) -> Armory:
    armory = Armory()
    evidence = EvidenceDir(out, 1 << 30)
    trigger = SlowTrigger(evidence, 1, {}, 1000.0, 3) if what == "slow" else ClockOnly(evidence, 1, {})
    armory.arm(trigger, AgentState(), None)
    return armory


def fixed_cost(out: str, calls: int = 20000, rounds: int = 5) -> dict[str, Any]:
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)

    def block() -> float:
        c0 = time.process_time()
        for _ in range(calls):
            opt.step()
        return (time.process_time() - c0) / calls

    times: dict[str, list[float]] = {"plain": [], "clock": [], "slow": []}
    for _ in range(rounds):
        times["plain"].append(block())
        for what in ("clock", "slow"):
            armory = armed(out, what)
            times[what].append(block())
            armory.disarm()
    p, c, s = (statistics.median(times[k]) for k in ("plain", "clock", "slow"))
    return {"plain_step_call_us": round(1e6 * p, 2), "clock_us_per_step": round(1e6 * (c - p), 2),
            "slow_listener_us_per_step": round(1e6 * (s - c), 2),
            "armed_us_per_step": round(1e6 * (s - p), 2)}


def loop_cost(rounds: int, seconds: float, out: str) -> dict[str, Any]:
    step = loop("small")
    for _ in range(20):
        step()
    cpu, wall, plain_cpu = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            plain = run_block(step, seconds, 200)
        armory = armed(out, "slow")
        with_slow = run_block(step, seconds, 200)
        armory.disarm()
        if r % 2:
            plain = run_block(step, seconds, 200)
        cpu.append(plain[0] / with_slow[0])
        wall.append(plain[1] / with_slow[1])
        plain_cpu.append(plain[0])
    rate = statistics.median(cpu)
    return {"plain_step_cpu_ms": round(1000 * statistics.median(plain_cpu), 3),
            "armed_over_plain_rate_cpu": round(rate, 4), "cost_pct": round(100 * (1 - rate), 2),
            "armed_over_plain_rate_wall": round(statistics.median(wall), 4), "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core: the machine is shared; ratios stay comparable
    with tempfile.TemporaryDirectory(prefix="fp-bench-slow-") as tmp:
        fixed = fixed_cost(tmp)
        small = loop_cost(args.rounds, args.seconds, tmp)
    if args.json:
        print(json.dumps({"fixed": fixed, "small": small}, indent=2))
        return
    print(f"per optimizer.step(): step clock {fixed['clock_us_per_step']} us CPU, slow listener "
          f"{fixed['slow_listener_us_per_step']} us more ({fixed['plain_step_call_us']} us plain "
          f"call of a one-scalar SGD step)")
    print(f"small loop: {small['plain_step_cpu_ms']} ms CPU per step plain; armed/plain step rate "
          f"{small['armed_over_plain_rate_cpu']} by CPU time (cost {small['cost_pct']} %), "
          f"{small['armed_over_plain_rate_wall']} by wall time")


if __name__ == "__main__":
    main()
