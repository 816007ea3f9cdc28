"""job-hang / job-desync, from the ranks' stack samples: ranks wait in a collective that one or
more ranks never reach.

From per-rank stack samples (``flight_profiler.rank_stacks`` files): a rank *waits* when its
busiest thread is inside a torch.distributed collective in every sample, or inside ``backward``
in every sample without running (no CPU time, no wake-up: DDP's gradient all-reduce runs in C++
autograd hooks and backward waits for it; a backward that computes or completes step after step
is not waiting). When some ranks wait and the others are elsewhere (Python code, data loading),
the others are the odd ones: critical (a hang) when every stack stayed the same across the
samples and the waiting ranks' threads never woke up meanwhile (kernel counters, when the
samples carry them: a collective that completes step after step wakes its thread every step), a
warning (they are behind) when the ranks still move. When every rank waits but not in the same
collective call, the job is desynchronised (a rank skipped or added a collective). Flight
Recorder data, when the job has it, says which rank is behind by collective sequence number.

The odd rank's place is the innermost frame of the program's own code (``wait_for_batch`` at
train.py:97), with the library frames it is blocked in as context (``Queue.get``,
``Condition.wait``). The decision is part of the one job verdict (job_verdict.py), so that
job-hang, job-desync and job-straggler never contradict each other.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.rank_list import format_ranks
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rank_stacks import Position, primary_thread, rank_position, stack_key
from flight_profiler.report.rules.job_common import JT, missing_ranks
from flight_profiler.report.rules.job_fr import FlightRecorder, ranks_text

DDP_WAIT = "the DDP gradient all-reduce (in backward)"

_FIX_HANG = [
    "Look at the odd rank's line above: a collective inside `if rank == ...`, an early `break` "
    "or `return`, an exception swallowed on one rank, or data that ends sooner on one rank "
    "(uneven shards: use DistributedSampler(drop_last=True) or `join()`).",
    "Make every rank call the same collectives in the same order; a collective under a "
    "rank-dependent condition needs its twin on the other ranks.",
    "Next time, start the job with TORCH_FR_BUFFER_SIZE=2000 (Flight Recorder) and a finite "
    "timeout in init_process_group(timeout=...), so a hang is dumped and reported by itself.",
]


class StackRank:
    """One rank's stack samples (its latest stack file): where it is, and whether it moves."""

    def __init__(self, rank: int, inp: InputResult) -> None:
        self.rank = rank
        self.inp = inp
        samples: list[dict[str, Any]] = inp.data.get("samples", [])
        self.positions: list[Position] = [rank_position(s) for s in samples]
        keys = []
        threads = []
        for s in samples:
            t = primary_thread(s)
            threads.append(t)
            keys.append(stack_key(t.get("frames", [])) if t else ())
        self.same_stack = len(samples) >= JT.hang_min_samples and len(set(keys)) == 1
        self.wakeups = _counter(threads, "switches")
        self.cpu_ticks = _counter(threads, "cpu_ticks")
        # Still: the same stack, and (when the agent read the thread's counters) the thread did
        # not keep blocking and waking up, nor computing, meanwhile. A collective that completes
        # step after step wakes its thread every step; a hung one never does.
        self.still = (self.same_stack
                      and (self.wakeups is None or self.wakeups < JT.hang_moving_wakeups)
                      and (self.cpu_ticks is None or self.cpu_ticks <= JT.hang_moving_cpu_ticks))
        self.samples = len(samples)
        times = [float(s["time"]) for s in samples if isinstance(s.get("time"), (int, float))]
        self.seconds = (max(times) - min(times)) if len(times) >= 2 else 0.0

    @property
    def waiting(self) -> bool:
        """Inside a collective in every sample; or inside backward in every sample while its
        thread did not run (measured: the counters are needed, a computing backward looks the
        same from the stack)."""
        if not self.positions:
            return False
        if all(p.kind == "collective" for p in self.positions):
            return True
        return (all(p.kind == "backward" for p in self.positions) and self.still
                and self.wakeups is not None and self.cpu_ticks is not None)

    @property
    def never_in_collective(self) -> bool:
        return not self.waiting and all(p.kind != "collective" for p in self.positions)

    @property
    def last(self) -> Position:
        return self.positions[-1] if self.positions else Position("idle", None, "-", "-")

    @property
    def op(self) -> str:
        """The collective it waits in, by name."""
        p = self.last
        return DDP_WAIT if p.kind == "backward" else str(p.op)


def _counter(threads: list[dict[str, Any] | None], name: str) -> int | None:
    """How much a counter of the sampled thread (``stack`` with ``progress``: ``switches``, how
    many times it blocked and woke up; ``cpu_ticks``, its CPU time) grew between the first and
    the last sample; None without the counters or if the thread changed."""
    first, last = threads[0] if threads else None, threads[-1] if threads else None
    if not first or not last or first.get("ident") != last.get("ident"):
        return None
    a, b = first.get("progress"), last.get("progress")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    x, y = a.get(name), b.get(name)
    if not isinstance(x, int) or not isinstance(y, int) or isinstance(x, bool) or y < x:
        return None
    return y - x


_ranks = ranks_text


def _full(p: Position) -> str:
    """``/w/train.py:97 in wait_for_batch (in Condition.wait at threading.py:327 < Queue.get at
    queue.py:171)``: the program's line, then what it is blocked in."""
    line = p.where.rsplit(":", 1)[-1]
    out = f"{p.path}:{line} in {p.function}" if p.path else f"{p.where} in {p.function}"
    return out + (f" (in {p.inside()})" if p.context else "")


def latest(inputs: list[InputResult]) -> InputResult:
    """A rank's most recent stack file."""
    def when(i: InputResult) -> float:
        samples = i.data.get("samples") or [{}]
        t = samples[-1].get("time")
        return float(t) if isinstance(t, (int, float)) else 0.0
    return max(inputs, key=when)


def _groups(ranks: list[StackRank]) -> list[tuple[tuple[str, str], list[int]]]:
    sites: dict[tuple[str, str], list[int]] = {}
    for r in ranks:
        sites.setdefault((r.op, r.last.where), []).append(r.rank)
    return sorted(sites.items(), key=lambda kv: (-len(kv[1]), kv[1]))


def stack_findings(ranks: dict[int, StackRank], fr: FlightRecorder, traced: set[int]) -> list[Finding]:
    """job-hang / job-desync from the ranks' stack samples (and Flight Recorder). ``traced``:
    the ranks with traces, whose "behind" verdict is the straggler analysis' (job_verdict)."""
    if len(ranks) < 2:
        return []
    waiting = [x for x in ranks.values() if x.waiting]
    if not waiting:
        return []
    others = [x for x in ranks.values() if not x.waiting]
    inputs = [x.inp.path for x in ranks.values()]
    world = next((x.inp.data.get("world_size") for x in ranks.values()
                  if x.inp.data.get("world_size")), None)
    absent = missing_ranks(world, set(ranks))
    span = max(x.seconds for x in ranks.values())
    n_samples = min(x.samples for x in ranks.values())
    common = [f"{n_samples} stack sample(s) per rank over {span:.1f} s", *fr.evidence]
    common += [f"rank {x.rank}: the same stack in every sample, but its thread blocked and woke "
               f"up {x.wakeups} times meanwhile: its collectives complete (moving, not hung)"
               for x in waiting if x.same_stack and not x.still][:8]
    if absent:
        common.append(f"no data for {_ranks(absent)} (dead, or on another node: "
                      "run --all-ranks there too)")
    if others:
        return _odd_ranks(ranks, waiting, others, common, inputs, fr, traced, n_samples)
    return _all_waiting(ranks, waiting, common, inputs, fr, absent)


def _odd_ranks(ranks: dict[int, StackRank], waiting: list[StackRank], others: list[StackRank],
               common: list[str], inputs: list[str], fr: FlightRecorder, traced: set[int],
               n_samples: int) -> list[Finding]:
    odd = [x for x in others if x.never_in_collective] or others
    (op, where), wait_ranks = _groups(waiting)[0]
    # The odd ranks' own wake-ups do not count: a rank polling in a sleep loop for something
    # that never comes is as hung as one blocked, as long as the others' collectives never
    # complete.
    stuck = all(x.still for x in waiting) and all(x.same_stack for x in odd)
    if not stuck and not all(x.never_in_collective for x in odd):
        return []
    odd_ranks = sorted(x.rank for x in odd)
    if not stuck and set(odd_ranks) <= traced:
        # Still moving, and profiled: the traces measure how far behind it is (the
        # job-straggler verdict); a "behind" warning from three stack samples would only
        # repeat that with less evidence, under the name of a hang.
        return []
    places = "; ".join(f"rank {x.rank} is at {x.last.describe()}" for x in odd[:8])
    sev = "critical" if stuck else "warning"
    plural = len(odd_ranks) > 1
    what = ("never reach" if plural else "never reaches") if stuck else \
        ("are behind in reaching" if plural else "is behind in reaching")
    return [Finding(
        rule="job-hang", severity=sev,
        title=f"{_ranks(odd_ranks).capitalize()} {what} {op}: "
              f"{_ranks(sorted(x.rank for x in waiting))} "
              f"{'waits' if len(waiting) == 1 else 'wait'} for "
              f"{'it' if len(odd_ranks) == 1 else 'them'}",
        summary=(f"{_ranks(wait_ranks).capitalize()} {'waits' if len(wait_ranks) == 1 else 'wait'} "
                 f"in {op} at {where} in every sample, "
                 f"while {places}" + (" (the same stack in every sample: stuck)." if stuck
                                      else " (still moving: slow, not stuck yet).")),
        evidence=common + [f"rank {x.rank}: {x.last.describe()}" for x in ranks.values()][:64],
        where=[f"rank {x.rank}: {_full(x.last)}" for x in odd[:8]],
        fix=_FIX_HANG if stuck else [
            "The odd rank does more work per step: profile every rank "
            "(`diagnose PID --all-ranks`) to see what it spends the time in.", *_FIX_HANG[:1]],
        root_cause=(f"A collective completes only when every rank of the group calls it; "
                    f"{_ranks(odd_ranks)} {'are' if plural else 'is'} elsewhere, so the others wait."),
        inputs=inputs, ranks=odd_ranks,
        metrics={"waiting_ranks": sorted(x.rank for x in waiting), "odd_ranks": odd_ranks,
                 "stuck": stuck, "samples": n_samples, "flight_recorder_behind": fr.behind,
                 "where": {str(x.rank): _full(x.last) for x in odd[:8]}},
    )]


def _all_waiting(ranks: dict[int, StackRank], waiting: list[StackRank], common: list[str],
                 inputs: list[str], fr: FlightRecorder, absent: list[int]) -> list[Finding]:
    groups = _groups(waiting)
    if len(groups) >= 2 and all(x.still for x in waiting):
        (op, where), main_ranks = groups[0]
        odd_ranks = sorted(r for _, rs in groups[1:] for r in rs)
        if len(groups[0][1]) == len(groups[1][1]):
            odd_ranks = sorted(set(odd_ranks) | set(fr.behind)) if fr.behind else odd_ranks
        lines = [f"{_ranks(rs)}: {o} at {w}" for (o, w), rs in groups]
        return [Finding(
            rule="job-desync", severity="critical",
            title=f"Ranks wait in different collectives: {_ranks(odd_ranks)} "
                  f"called another one than {_ranks(main_ranks)}",
            summary="Every rank waits in a collective, but not in the same call: " + "; ".join(lines)
                    + ". The ranks called their collectives in different orders (one skipped or "
                      "added one), so no collective can complete.",
            evidence=common + lines,
            where=[f"rank {r}: {_full(ranks[r].last)}" for r in odd_ranks[:8]],
            fix=_FIX_HANG,
            root_cause="Collectives are matched by order: a rank that skips one (or calls one "
                       "more) pairs its calls with the wrong calls of the others.",
            inputs=inputs, ranks=odd_ranks,
            metrics={"groups": [{"op": o, "where": w, "ranks": rs} for (o, w), rs in groups],
                     "flight_recorder_behind": fr.behind},
        )]
    if (fr.mismatched or fr.behind) and all(x.still for x in waiting):
        # The stacks look alike (same collective, same line); Flight Recorder tells them apart.
        (op, where), _ = groups[0]
        odd_ranks = fr.mismatched or fr.behind
        desync = bool(fr.mismatched)
        return [Finding(
            rule="job-desync" if desync else "job-hang", severity="critical",
            title=(f"{_ranks(odd_ranks).capitalize()} called another collective than the others "
                   "under the same sequence number" if desync else
                   f"{_ranks(odd_ranks).capitalize()} behind the others by Flight Recorder; "
                   f"every rank waits in {op}"),
            summary=(f"Every rank waits in {op} at {where} in every sample; Flight Recorder's "
                     "sequence ids show " + ("that the calls do not match" if desync else
                                             f"that {_ranks(odd_ranks)} did not enqueue the "
                                             "collective the others wait in") + "."),
            evidence=common,
            where=[f"rank {r}: {_full(ranks[r].last)}" for r in odd_ranks[:8]],
            fix=_FIX_HANG,
            root_cause="Collectives are matched by order within a process group: the ranks "
                       "disagree about which one comes next.",
            inputs=inputs, ranks=odd_ranks,
            metrics={"waiting_ranks": sorted(ranks), "flight_recorder_behind": fr.behind,
                     "flight_recorder_mismatched": fr.mismatched},
        )]
    if absent and all(x.still for x in waiting):
        (op, where), _ = groups[0]
        return [Finding(
            rule="job-hang", severity="warning",
            title=f"Every local rank waits in {op}; ranks {format_ranks(absent)} are not here",
            summary=f"Ranks {format_ranks(sorted(ranks))} wait in {op} at {where} in every sample. "
                    f"The rank(s) they wait for are among {format_ranks(absent)}.",
            evidence=common, where=[where],
            fix=["Run `flight_profiler diagnose PID --all-ranks --out DIR/nodeK` on every node and "
                 "`flight_profiler report DIR` (one directory per node): the odd rank and its node "
                 "are named then."],
            root_cause="A collective waits for every rank of its group; the late ones are not on "
                       "this node.",
            inputs=inputs, ranks=absent,
            metrics={"waiting_ranks": sorted(ranks), "absent_ranks": absent},
        )]
    return []
