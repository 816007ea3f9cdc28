"""job-hang / job-desync: ranks wait in a collective that one or more ranks never reach.

From per-rank stack samples (``flight_profiler.rank_stacks`` files): a rank *waits* when its
busiest thread is inside a torch.distributed collective in every sample. When some ranks wait
and the others are elsewhere (Python code, data loading), the others are the odd ones: critical
(a hang) when every stack stayed the same across the samples and the waiting ranks' threads
never woke up meanwhile (kernel context-switch counters, when the samples carry them: a
collective that completes step after step wakes its thread hundreds of times a second), a
warning (they are behind) when the ranks still move. When every rank waits but not in the same collective call,
the job is desynchronised (a rank skipped or added a collective). Flight Recorder data, when
the job has it, says which rank is behind by collective sequence number.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.rank_list import format_ranks
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rank_stacks import Position, primary_thread, rank_position, stack_key
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.rules.job_common import JT, by_rank, missing_ranks

_FIX_HANG = [
    "Look at the odd rank's line above: a collective inside `if rank == ...`, an early `break` "
    "or `return`, an exception swallowed on one rank, or data that ends sooner on one rank "
    "(uneven shards: use DistributedSampler(drop_last=True) or `join()`).",
    "Make every rank call the same collectives in the same order; a collective under a "
    "rank-dependent condition needs its twin on the other ranks.",
    "Next time, start the job with TORCH_FR_BUFFER_SIZE=2000 (Flight Recorder) and a finite "
    "timeout in init_process_group(timeout=...), so a hang is dumped and reported by itself.",
]


class _Rank:
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
        self.wakeups = _wakeups(threads)
        # Still: the same stack, and (when the agent read the thread's counters) the thread did
        # not keep blocking and waking up meanwhile. A collective that completes step after
        # step shows hundreds of wake-ups a second on the same line; a hung one shows none.
        self.still = self.same_stack and (self.wakeups is None
                                          or self.wakeups < JT.hang_moving_wakeups)
        self.samples = len(samples)
        times = [float(s["time"]) for s in samples if isinstance(s.get("time"), (int, float))]
        self.seconds = (max(times) - min(times)) if len(times) >= 2 else 0.0

    @property
    def waiting(self) -> bool:
        return bool(self.positions) and all(p.kind == "collective" for p in self.positions)

    @property
    def never_in_collective(self) -> bool:
        return all(p.kind != "collective" for p in self.positions)

    @property
    def last(self) -> Position:
        return self.positions[-1] if self.positions else Position("idle", None, "-", "-")


def _wakeups(threads: list[dict[str, Any] | None]) -> int | None:
    """How many times the sampled thread blocked and woke up between the first and the last
    sample (``stack`` with ``progress``), or None without the counters or if the thread changed."""
    first, last = threads[0] if threads else None, threads[-1] if threads else None
    if not first or not last or first.get("ident") != last.get("ident"):
        return None
    a, b = first.get("progress"), last.get("progress")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    x, y = a.get("switches"), b.get("switches")
    if not isinstance(x, int) or not isinstance(y, int) or isinstance(x, bool) or y < x:
        return None
    return y - x


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _full(p: Position) -> str:
    line = p.where.rsplit(":", 1)[-1]
    return f"{p.path}:{line} in {p.function}" if p.path else f"{p.where} in {p.function}"


def _latest(inputs: list[InputResult]) -> InputResult:
    def when(i: InputResult) -> float:
        samples = i.data.get("samples") or [{}]
        t = samples[-1].get("time")
        return float(t) if isinstance(t, (int, float)) else 0.0
    return max(inputs, key=when)


def _fr_call(e: dict[str, Any]) -> str:
    sizes = e.get("input_sizes")
    return f"{e.get('op')} {sizes}" if sizes else str(e.get("op"))


def _flight_recorder(ranks: dict[int, _Rank]) -> tuple[list[int], list[int], list[str]]:
    """From the ranks' Flight Recorder summaries: the ranks behind (a lower last sequence id in
    a process group), the ranks whose call under the same sequence id differs from the most
    common one (a desync), and the evidence lines."""
    last: dict[int, dict[str, int]] = {}
    calls: dict[int, dict[tuple[str, int], str]] = {}
    for r, info in ranks.items():
        fr = info.inp.data.get("flight_recorder")
        if fr and isinstance(fr.get("last_enqueued"), dict):
            last[r] = {str(k): int(v) for k, v in fr["last_enqueued"].items() if isinstance(v, int)}
            calls[r] = {(str(e.get("pg_id")), int(e["seq"])): _fr_call(e)
                        for e in fr.get("entries", []) if isinstance(e, dict) and isinstance(e.get("seq"), int)}
    if len(last) < 2:
        return [], [], []
    behind: set[int] = set()
    mismatched: set[int] = set()
    evidence: list[str] = []
    for pg in sorted({pg for d in last.values() for pg in d}):
        seqs = {r: d[pg] for r, d in last.items() if pg in d}
        if len(seqs) < 2:
            continue
        top = max(seqs.values())
        late = sorted(r for r, s in seqs.items() if s < top)
        if late:
            behind.update(late)
            evidence.append(f"Flight Recorder, process group {pg}: {_ranks(late)} last enqueued "
                            f"collective #{min(seqs[r] for r in late)}, the others #{top}")
        common = min(seqs.values())
        names: dict[str, list[int]] = {}
        for r in seqs:
            call = calls.get(r, {}).get((pg, common))
            if call:
                names.setdefault(call, []).append(r)
        if len(names) > 1:
            ordered = sorted(names.items(), key=lambda kv: (-len(kv[1]), kv[1]))
            for _, rs in ordered[1:]:
                mismatched.update(rs)
            evidence.append(f"Flight Recorder, process group {pg}, collective #{common}: " + "; ".join(
                f"{call} on {_ranks(rs)}" for call, rs in ordered))
    return sorted(behind), sorted(mismatched), evidence


def _groups(ranks: list[_Rank]) -> list[tuple[tuple[str | None, str], list[int]]]:
    sites: dict[tuple[str | None, str], list[int]] = {}
    for r in ranks:
        sites.setdefault((r.last.op, r.last.where), []).append(r.rank)
    return sorted(sites.items(), key=lambda kv: (-len(kv[1]), kv[1]))


def check(ctx: Context) -> list[Finding]:
    per = by_rank(ctx.stacks)
    if len(per) < 2:
        return []
    ranks = {r: _Rank(r, _latest(inputs)) for r, inputs in per.items()}
    waiting = [x for x in ranks.values() if x.waiting]
    if not waiting:
        return []
    others = [x for x in ranks.values() if not x.waiting]
    inputs = [x.inp.path for x in ranks.values()]
    world = next((x.inp.data.get("world_size") for x in ranks.values()
                  if x.inp.data.get("world_size")), None)
    absent = missing_ranks(world, set(ranks))
    fr_late, fr_mismatch, fr_evidence = _flight_recorder(ranks)
    span = max(x.seconds for x in ranks.values())
    n_samples = min(x.samples for x in ranks.values())
    common = [f"{n_samples} stack sample(s) per rank over {span:.1f} s", *fr_evidence]
    common += [f"rank {x.rank}: the same stack in every sample, but its thread blocked and woke "
               f"up {x.wakeups} times meanwhile: its collectives complete (moving, not hung)"
               for x in waiting if x.same_stack and not x.still][:8]
    if absent:
        common.append(f"no data for {_ranks(absent)} (dead, or on another node: "
                      "run --all-ranks there too)")
    if others:
        odd = [x for x in others if x.never_in_collective] or others
        wait_groups = _groups(waiting)
        (op, where), wait_ranks = wait_groups[0]
        # The odd ranks' own wake-ups do not count: a rank polling in a sleep loop for something
        # that never comes is as hung as one blocked, as long as the others' collectives never
        # complete.
        stuck = all(x.still for x in waiting) and all(x.same_stack for x in odd)
        if not stuck and not all(x.never_in_collective for x in odd):
            return []
        odd_ranks = sorted(x.rank for x in odd)
        traced = {t.rank for t in ctx.traces if t.rank is not None}
        if not stuck and set(odd_ranks) <= traced:
            # Still moving, and profiled: the traces measure how far behind it is (the
            # job-straggler rule); a "behind" warning from three stack samples would only
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
                "The odd rank does more work per step: see job-straggler (per-rank traces) for "
                "what it spends the time in.", *_FIX_HANG[:1]],
            root_cause=(f"A collective completes only when every rank of the group calls it; "
                        f"{_ranks(odd_ranks)} {'are' if plural else 'is'} elsewhere, so the others wait."),
            inputs=inputs, ranks=odd_ranks,
            metrics={"waiting_ranks": sorted(x.rank for x in waiting), "odd_ranks": odd_ranks,
                     "stuck": stuck, "samples": n_samples, "flight_recorder_behind": fr_late},
        )]
    groups = _groups(waiting)
    if len(groups) >= 2 and all(x.still for x in waiting):
        (op, where), main_ranks = groups[0]
        odd_ranks = sorted(r for _, rs in groups[1:] for r in rs)
        if len(groups[0][1]) == len(groups[1][1]):
            odd_ranks = sorted(set(odd_ranks) | set(fr_late)) if fr_late else odd_ranks
        lines = [f"{_ranks(rs)}: {o} at {w}" for (o, w), rs in groups]
        return [Finding(
            rule="job-desync", severity="critical",
            title=f"Ranks wait in different collectives: {_ranks(odd_ranks)} "
                  f"called another one than {_ranks(main_ranks)}",
            summary="Every rank waits in a collective, but not in the same call: " + "; ".join(lines)
                    + ". The ranks called their collectives in different orders (one skipped or "
                      "added one), so no collective can complete.",
            evidence=common + lines,
            where=[f"rank {r}: {ranks[r].last.describe()}" for r in odd_ranks[:8]],
            fix=_FIX_HANG,
            root_cause="Collectives are matched by order: a rank that skips one (or calls one "
                       "more) pairs its calls with the wrong calls of the others.",
            inputs=inputs, ranks=odd_ranks,
            metrics={"groups": [{"op": o, "where": w, "ranks": rs} for (o, w), rs in groups],
                     "flight_recorder_behind": fr_late},
        )]
    if (fr_mismatch or fr_late) and all(x.still for x in waiting):
        # The stacks look alike (same collective, same line); Flight Recorder tells them apart.
        (op, where), _ = groups[0]
        odd_ranks = fr_mismatch or fr_late
        desync = bool(fr_mismatch)
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
            where=[f"rank {r}: {ranks[r].last.describe()}" for r in odd_ranks[:8]],
            fix=_FIX_HANG,
            root_cause="Collectives are matched by order within a process group: the ranks "
                       "disagree about which one comes next.",
            inputs=inputs, ranks=odd_ranks,
            metrics={"waiting_ranks": sorted(ranks), "flight_recorder_behind": fr_late,
                     "flight_recorder_mismatched": fr_mismatch},
        )]
    if absent and all(x.still for x in waiting):
        (op, where), _ = groups[0]
        return [Finding(
            rule="job-hang", severity="warning",
            title=f"Every local rank waits in {op}; ranks {format_ranks(absent)} are not here",
            summary=f"Ranks {format_ranks(sorted(ranks))} wait in {op} at {where} in every sample. "
                    f"The rank(s) they wait for are among {format_ranks(absent)}.",
            evidence=common, where=[where],
            fix=["Run `flight_profiler PID --all-ranks` on the other nodes into the same directory "
                 "and `flight_profiler report DIR` on all of it: the odd rank is named then."],
            root_cause="A collective waits for every rank of its group; the late ones are not on "
                       "this node.",
            inputs=inputs, ranks=absent,
            metrics={"waiting_ranks": sorted(ranks), "absent_ranks": absent},
        )]
    return []


RULE = Rule("job-hang", "A rank never reaches the collective the others wait in", check)
