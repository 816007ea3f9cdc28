"""graph-chain: ONE held tensor whose autograd graph grows from census to census.

The shape of carried state that is never detached: an RNN/LSTM hidden state passed from chunk
to chunk (``h = lstm(x, h)``), a running sum of losses (``total = total + loss``), an attention
cache. The holder keeps one or two tensors, but each step's graph is chained to the previous
one, so the graph (and every activation saved in it) grows without bound. graph-retention
catches many graph-carrying tensors piling up in a container; this catches the single chain.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes


def _where(path: str, example: str) -> str:
    if path.startswith("<"):
        return (f"{path}: not reachable from a module global or a running function's local the census "
                "could read (a local of the main loop, a closure, a generator's state)")
    return f"{path} (e.g. {example})"


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for series in ctx.census_series:
        hist: dict[str, list[dict[str, Any] | None]] = {}
        for k, c in enumerate(series):
            for h in c.data["holders"]:
                hist.setdefault(h["path"], [None] * len(series))[k] = h
        for path, maybe in hist.items():
            points = [p for p in maybe if p is not None]
            if len(points) != len(series):
                continue  # not held at every census: not one carried chain
            last = points[-1]
            if int(last["count"]) > T.graph_chain_max_tensors or int(last["with_grad_fn"]) < 1:
                continue
            graph = [int(p["graph_bytes"]) for p in points]
            counts = [int(p["with_grad_fn"]) for p in points]
            # A carried chain has a graph at every census, growing each time; a step's own
            # local (`loss` inside train_step) has none between steps and a fresh one within.
            if graph[0] <= 0 or not all(b > a for a, b in zip(graph, graph[1:])):
                continue
            growth = graph[-1] - graph[0]
            if growth < T.graph_chain_min_growth_bytes or counts[-1] - counts[0] >= T.graph_growth_min_count:
                continue
            span = (series[-1].data.get("time") or 0) - (series[0].data.get("time") or 0)
            rate = f", {fmt_bytes(growth / span)}/s" if span > 0 else ""
            example = str(last.get("example", path))
            out.append(Finding(
                rule="graph-chain", severity="critical" if len(series) >= 3 else "warning",
                title=f"{path} carries an autograd graph that grows at every step: .detach() it",
                summary=(f"{path} holds {last['count']} tensor(s) with grad_fn, and the graph behind "
                         f"them grew {fmt_bytes(graph[0])} -> {fmt_bytes(graph[-1])} across "
                         f"{len(series)} censuses{rate}: each step's graph is chained to the previous one."),
                evidence=[f"{c.name}: {p['count']} tensor(s), {p['with_grad_fn']} with grad_fn, "
                          f"graph {fmt_bytes(int(p['graph_bytes']))}" for c, p in zip(series, points)],
                where=[_where(path, example)],
                root_cause=("State carried from one step to the next (RNN/LSTM hidden state, a running "
                            "sum of losses, a cache) keeps its grad_fn: the next step's graph hangs off the "
                            "previous one, so backward() would walk every step since the start and every "
                            "saved activation stays in memory."),
                fix=["Cut the chain where the state is carried over: `h = h.detach()` (LSTM: "
                     "`h, c = h.detach(), c.detach()`) at the start of each chunk (truncated BPTT).",
                     "For a running metric: `total += loss.item()` (or `loss.detach()`), not `total += loss`."],
                inputs=[c.path for c in series],
                metrics={"holder": path, "graph_bytes": graph, "with_grad_fn": counts, "growth_bytes": growth}))
    return out


def _from_calls(ctx: Context) -> list[Finding]:
    """From `torch grads METHOD`: a tensor the method returns or keeps on ``self`` whose graph,
    after every call, reaches the root the same tensor had after the previous call."""
    out: list[Finding] = []
    for g in ctx.grads:
        doc = g.data
        carried = [m.get("carried") for m in doc.get("measurements") or []]
        if len(carried) < 3 or any(not isinstance(c, dict) for c in carried):
            continue
        named: set[str] = set()
        for name in carried[-1]:
            links = [c.get(name, {}).get("chained") for c in carried[1:]]
            if name.split("[")[0] in named or not links or not all(link is True for link in links):
                continue
            named.add(name.split("[")[0])  # one finding for (h, c): the same state
            holder = f"{doc.get('target')}: {name}"
            what = "returns" if name.startswith("return") else "keeps on self"
            var = "h" if name.startswith("return") else name.split("[")[0]
            out.append(Finding(
                rule="graph-chain", severity="critical",
                title=f"{holder} carries an autograd graph that grows at every call: .detach() it",
                summary=(f"After each of {len(carried)} calls, the graph behind the tensor {doc.get('target')} "
                         f"{what} ({name}) reached the one it had after the previous call: each call's graph "
                         "hangs off the previous one, so it grows for as long as the program runs."),
                evidence=[f"call {k + 2}: the graph of {name} reaches the previous call's root "
                          f"({c[name].get('walked')} nodes looked at)" for k, c in enumerate(carried[1:])],
                where=[holder],
                root_cause=("State carried from one call to the next keeps its grad_fn: the next call's "
                            "graph hangs off it, so memory (every saved activation) grows for as long as "
                            "the program runs, and a backward would walk all of it."),
                fix=[f"Detach where the state is carried over, before the next call: `{var} = {var}.detach()` "
                     "(an LSTM's (h, c): detach both), i.e. truncated BPTT.",
                     "If no backward is needed at all, run the calls under `torch.inference_mode()`."],
                inputs=[g.path], metrics={"holder": holder, "links": links}))
    return out


def check_all(ctx: Context) -> list[Finding]:
    return check(ctx) + _from_calls(ctx)


RULE = Rule("graph-chain", "One held tensor whose autograd graph keeps growing", check_all)
