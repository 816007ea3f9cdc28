"""What the ranks' Flight Recorder summaries say, together (in the stack files of
``diagnose --all-ranks``, from ``torch fr``; only when the job runs with TORCH_FR_BUFFER_SIZE).

- who is behind: a lower last enqueued sequence id in a process group (a rank that never reached
  the collective the others are in);
- who disagrees: another call (op, input sizes) under the same sequence id (a desync);
- who comes last: for each collective recorded on several ranks, the rank that enqueued it
  last, and by how much (``time_created_ns``, the ranks' wall clocks: comparable on one node
  only, so with stack files from several nodes they are compared within each node). In a synchronous job the others wait that long in it:
  the rank that is last in most collectives is the one the others wait for. This holds for
  collectives without a Python frame too (DDP's gradient all-reduce, enqueued from its autograd
  hooks when a bucket is ready).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from flight_profiler.rank_list import format_ranks
from flight_profiler.report.models import InputResult


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


@dataclass
class FlightRecorder:
    present: list[int] = field(default_factory=list)  # ranks whose summary is there
    disabled: list[int] = field(default_factory=list)  # ranks that said it is not enabled
    behind: list[int] = field(default_factory=list)
    mismatched: list[int] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    # per rank: {"last": n collectives it enqueued last, "of": n compared, "lag_us": median lag}
    lags: dict[int, dict[str, float]] = field(default_factory=dict)
    per_node: bool = False  # the ranks span nodes: lags compared within each node only

    def latest(self) -> int | None:
        """The rank that enqueued most collectives last, if it did so in most of them."""
        if not self.lags:
            return None
        r = max(self.lags, key=lambda k: (self.lags[k]["last"], self.lags[k]["lag_us"]))
        got = self.lags[r]
        return r if got["of"] >= 3 and got["last"] * 2 > got["of"] else None


def _call(e: dict[str, Any]) -> str:
    sizes = e.get("input_sizes")
    return f"{e.get('op')} {sizes}" if sizes else str(e.get("op"))


def read(stacks: dict[int, InputResult]) -> FlightRecorder:
    out = FlightRecorder()
    last: dict[int, dict[str, int]] = {}
    calls: dict[int, dict[tuple[str, int], str]] = {}
    created: dict[tuple[str, int], dict[int, int]] = {}
    node: dict[int, int | None] = {}
    for r, inp in sorted(stacks.items()):
        where = inp.data.get("node")
        node[r] = where.get("node_rank") if isinstance(where, dict) else None
        fr = inp.data.get("flight_recorder")
        if not isinstance(fr, dict):
            continue
        if fr.get("enabled") is False:
            out.disabled.append(r)
            continue
        if not isinstance(fr.get("last_enqueued"), dict):
            continue
        out.present.append(r)
        last[r] = {str(k): int(v) for k, v in fr["last_enqueued"].items()
                   if isinstance(v, int) and not isinstance(v, bool)}
        calls[r] = {}
        for e in fr.get("entries", []):
            if not isinstance(e, dict) or not isinstance(e.get("seq"), int):
                continue
            key = (str(e.get("pg_id")), int(e["seq"]))
            calls[r][key] = _call(e)
            ns = e.get("created_ns")
            if isinstance(ns, int) and not isinstance(ns, bool) and ns > 0:
                created.setdefault(key, {})[r] = ns
    if len(last) < 2:
        return out
    _order(out, last, calls)
    nodes = {node.get(r) for r in out.present}
    if len(nodes) < 2:
        _lags(out, created)
        return out
    # Enqueue times are each node's wall clock: compared between ranks of one node only,
    # never across nodes (their clocks' skew would decide who is "last").
    for n in sorted(nodes, key=lambda x: (x is None, x or 0)):
        part = FlightRecorder(present=[r for r in out.present if node.get(r) == n])
        _lags(part, {k: {r: t for r, t in v.items() if node.get(r) == n} for k, v in created.items()})
        out.lags.update(part.lags)
    out.per_node = True
    return out


def _order(out: FlightRecorder, last: dict[int, dict[str, int]],
           calls: dict[int, dict[tuple[str, int], str]]) -> None:
    behind: set[int] = set()
    mismatched: set[int] = set()
    for pg in sorted({pg for d in last.values() for pg in d}):
        seqs = {r: d[pg] for r, d in last.items() if pg in d}
        if len(seqs) < 2:
            continue
        top = max(seqs.values())
        late = sorted(r for r, s in seqs.items() if s < top)
        if late:
            behind.update(late)
            out.evidence.append(f"Flight Recorder, process group {pg}: {ranks_text(late)} last "
                                f"enqueued collective #{min(seqs[r] for r in late)}, the others #{top}")
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
            out.evidence.append(f"Flight Recorder, process group {pg}, collective #{common}: " + "; ".join(
                f"{call} on {ranks_text(rs)}" for call, rs in ordered))
    out.behind, out.mismatched = sorted(behind), sorted(mismatched)


def _lags(out: FlightRecorder, created: dict[tuple[str, int], dict[int, int]]) -> None:
    ranks = out.present
    lags: dict[int, list[float]] = {r: [] for r in ranks}
    last: dict[int, int] = dict.fromkeys(ranks, 0)
    compared = 0
    for times in created.values():
        if len(times) != len(ranks):
            continue  # not on every rank (yet): no one to compare with
        compared += 1
        first = min(times.values())
        latest = max(times, key=times.__getitem__)
        last[latest] += 1
        for r, ns in times.items():
            lags[r].append((ns - first) / 1000.0)
    if compared < 2:
        return
    out.lags = {r: {"last": float(last[r]), "of": float(compared),
                    "lag_us": statistics.median(lags[r])} for r in ranks}


def lag_lines(fr: FlightRecorder) -> list[str]:
    from flight_profiler.report.units import fmt_us

    if not fr.lags:
        return []
    lines = [f"Flight Recorder: rank {r} enqueued {int(v['last'])} of the last {int(v['of'])} "
             f"collectives last (median {fmt_us(v['lag_us'])} after the first rank"
             f"{' of its node' if fr.per_node else ''})"
             for r, v in sorted(fr.lags.items())][:16]
    if fr.per_node:
        lines.append("Flight Recorder enqueue times are each node's wall clock: compared within "
                     "each node only, never across nodes")
    return lines


def status_line(fr: FlightRecorder, ranks: list[int]) -> str | None:
    """What a reader needs to know when Flight Recorder could not help."""
    if fr.present:
        return None
    if fr.disabled:
        return ("Flight Recorder: not enabled in this job (start it with TORCH_FR_BUFFER_SIZE=2000 "
                "to see which rank enqueues each collective last)")
    return None if not ranks else "Flight Recorder: no summary in the stack files"
