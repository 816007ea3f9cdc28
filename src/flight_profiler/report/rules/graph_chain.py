"""graph-chain: ONE held tensor whose autograd graph grows from census to census.

The shape of carried state that is never detached: an RNN/LSTM hidden state passed from chunk
to chunk (``h = lstm(x, h)``), a running sum of losses (``total = total + loss``), an attention
cache. The holder keeps one or two tensors, but each step's graph is chained to the previous
one, so the graph (and every activation saved in it) grows without bound. graph-retention
catches many graph-carrying tensors piling up in a container; this catches the single chain.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report import census_growth
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes


def _where(path: str, example: str) -> str:
    if path.startswith("<"):
        return (f"{path}: not reachable from a module global or a running function's local the census "
                "could read (a local of the main loop, a closure, a generator's state)")
    return f"{path} (e.g. {example})"


def fix_for(var: str, scalar: bool) -> list[str]:
    """Cut the chain where the state is carried over; a running sum of losses keeps numbers."""
    detach = (f"Cut the chain where the state is carried over, at the start of each step/chunk: "
              f"`{var} = {var}.detach()`; for an RNN/LSTM's (h, c), "
              f"`{var} = repackage_hidden({var})` (detach every tensor of the tuple), i.e. "
              "truncated BPTT, as pytorch/examples' word_language_model does.")
    item = (f"For a running metric, accumulate a number: `{var} += loss.item()` (or "
            "`loss.detach()`), not `+= loss`.")
    return [item, detach] if scalar else [detach, item]


def _variable(path: str) -> str:
    """The variable a user would edit: ``train() local hidden[*]`` -> ``hidden``."""
    tail = path.split(" local ", 1)[-1] if " local " in path else path.rsplit(".", 1)[-1]
    return tail.split("[", 1)[0].split(".", 1)[0] or "h"


def _thread(path: str) -> str:
    return path.split(" local ", 1)[0].split(" ", 1)[0] if path.startswith("thread ") else "main"


def _chains(series: list[Any]) -> list[tuple[census_growth.History, list[bool | None]]]:
    """Holders of a few graph-carrying tensors whose graph reached the one they held at the
    previous census (``chained``, proven by the census) at every interval it could be told; for
    censuses that do not say, one whose graph grew at every census (the older test)."""
    found = []
    for h in census_growth.histories(series):
        if any(r is None for r in h.rows):
            continue  # not held at every census: not one carried chain
        last = h.last
        if int(last["count"]) > T.graph_chain_max_tensors or int(last["with_grad_fn"]) < 1:
            continue
        links = h.chained()
        # A chain that restarted (a running sum reset each epoch: `total = 0` then `+= loss`)
        # does not reach the old graph across the reset. It is still a chain when the latest
        # interval proves one; or, whatever the order, when the holder is a number whose graph
        # holds no saved tensor at any census (every backward() freed them): a running metric
        # chained by mistake, which no backward can use, where a bounded chain kept on purpose
        # (losses summed over K micro-batches for one backward, truncated BPTT over K chunks)
        # still holds its saved activations.
        metric = (int(last["bytes"]) <= 8 * max(1, int(last["count"]))
                  and all(g <= 0 for g in h.series("graph_bytes")))
        if any(link is False for link in links) and (
                True not in links or (links[-1] is not True and not metric)):
            continue
        if any(link is True for link in links):
            found.append((h, links))
            continue
        graph = h.series("graph_bytes")
        counts = h.series("with_grad_fn")
        # A carried chain has a graph at every census, growing each time; a step's own
        # local (`loss` inside train_step) has none between steps and a fresh one within.
        if graph[0] <= 0 or not census_growth.growing(graph):
            continue
        if graph[-1] - graph[0] < T.graph_chain_min_growth_bytes or counts[-1] - counts[0] >= T.graph_growth_min_count:
            continue
        found.append((h, links))
    # One carried state seen from several frames of one thread (the loop's `hidden` and a
    # running forward's): the outermost frame's name is the one the user edits.
    outermost: dict[str, int] = {}
    for h, _ in found:
        if h.root == "local":
            depth = int(h.last.get("depth", 0) or 0)
            key = _thread(h.path)
            outermost[key] = min(outermost.get(key, depth), depth)
    kept = []
    for h, links in found:
        if h.root == "local" and int(h.last.get("depth", 0) or 0) > outermost[_thread(h.path)]:
            continue
        if h.root == "return" and outermost:
            continue  # the same state, already named by the local that receives it
        kept.append((h, links))
    return kept


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for series in ctx.census_series:
        for h, links in _chains(series):
            path, last = h.path, h.last
            graph = h.series("graph_bytes")
            counts = h.series("with_grad_fn")
            proven = sum(1 for link in links if link is True)
            span = (series[-1].data.get("time") or 0) - (series[0].data.get("time") or 0)
            growth = graph[-1] - graph[0]
            rate = f", {fmt_bytes(growth / span)}/s" if span > 0 and growth > 0 else ""
            example = str(last.get("example", path))
            scalar = int(last["bytes"]) <= 8 * max(1, int(last["count"]))
            how = (f"its graph reached the one it held at the previous census at {proven} of "
                   f"{len(links)} intervals" if proven else
                   f"the graph behind it grew {fmt_bytes(graph[0])} -> {fmt_bytes(graph[-1])}")
            if False in links:
                how += " (at the others the chain had restarted: the holder was reset, e.g. at each epoch)"
            kept_alive = (f"graph kept alive {fmt_bytes(graph[0])} -> {fmt_bytes(graph[-1])}{rate}" if graph[-1]
                          else "no saved tensors: each backward() freed them; the chain of graph nodes "
                               "grows, one step's worth per step, until the holder is reset")
            out.append(Finding(
                rule="graph-chain",
                severity="critical" if proven >= 2 or (not proven and len(series) >= 3) else "warning",
                title=f"{path} carries an autograd graph that grows at every step: .detach() it",
                summary=(f"{path} holds {last['count']} tensor(s) with grad_fn, and {how} across "
                         f"{len(series)} censuses ({kept_alive}): each step's graph is chained to the "
                         "previous one."),
                evidence=[f"{c.name}: {r['count']} tensor(s), {r['with_grad_fn']} with grad_fn, "
                          f"graph {fmt_bytes(int(r['graph_bytes']))}"
                          + (", its graph reaches the one held at the previous census"
                             if k and r.get("chained") is True else "")
                          for k, (c, r) in enumerate(zip(series, h.rows)) if r is not None],
                where=[_where(path, example)],
                root_cause=("State carried from one step to the next (RNN/LSTM hidden state, a running "
                            "sum of losses, a cache) keeps its grad_fn: the next step's graph hangs off the "
                            "previous one, so backward() would walk every step since the start and every "
                            "saved activation stays in memory (`backward(retain_graph=True)` only silences "
                            "the error that says so)."),
                fix=fix_for(_variable(path), scalar),
                inputs=[c.path for c in series],
                metrics={"holder": path, "graph_bytes": graph, "with_grad_fn": counts,
                         "growth_bytes": growth, "chained": links}))
    return out


def _state(name: str) -> str:
    """The carried state a name belongs to: (h, c) are one state, ``return[1]``'s two tensors too."""
    if name.startswith("return"):
        return name[:name.rindex("[")] if name.count("[") >= 2 else name
    return name.split("[", 1)[0]


def _link(info: Any, trains: bool) -> bool | None:
    """A call's link to the previous call's graph. In a loop that trains, a link made with no
    backward between the two calls (``same_step``: a character RNN's name fed one character per
    call, backpropagated once at its end) is a step being built, not state carried past a step:
    no proof either way."""
    if not isinstance(info, dict):
        return None
    if trains and info.get("same_step"):
        return None
    chained = info.get("chained")
    return chained if isinstance(chained, bool) else None


def _chained_throughout(name: str, last: dict[str, Any], carried: list[dict[str, Any]],
                        trains: bool = False) -> bool:
    """Every call after the first reached the previous call's root. A loop's local that now holds
    what the method returned qualifies from the first call at which it held a graph: before it, it
    held the initial state (zeros, no grad_fn), which says nothing either way, and whether the
    measuring began before or after the loop's first call is chance."""
    links = [_link(c.get(name), trains) for c in carried[1:]]
    if links and all(link is True for link in links):
        return True
    source = last[name].get("from") if isinstance(last.get(name), dict) else None
    if not isinstance(source, str) or source == name or source not in last:
        return False
    source_links = [_link(c.get(source), trains) for c in carried[1:]]
    if not source_links or not all(link is True for link in source_links):
        return False
    while links and links[0] is None:
        links.pop(0)
    return len(links) >= 2 and all(link is True for link in links)


def _from_calls(ctx: Context) -> list[Finding]:
    """From `torch grads METHOD`: a tensor the method returns, keeps on ``self``, or that the
    loop's frame holds (``train() local hidden``) whose graph, after every call, reaches the
    root the same tensor had after the previous call. A loop's local that receives what the
    previous call returned is the same state: it is named by the local, the variable to edit."""
    out: list[Finding] = []
    for g in ctx.grads:
        doc = g.data
        carried = [m.get("carried") for m in doc.get("measurements") or []]
        if len(carried) < 3 or any(not isinstance(c, dict) for c in carried):
            continue
        target = doc.get("target")
        states: dict[str, list[str]] = {}
        received: set[str] = set()
        last = carried[-1]
        # backward passes counted while measured (older documents: unknown, every link counts)
        trains = int((doc.get("zeroing") or {}).get("backward_calls") or 0) > 0
        for name, info in last.items():
            if not _chained_throughout(name, last, carried, trains):
                continue
            states.setdefault(_state(name), []).append(name)
            source = info.get("from") if isinstance(info, dict) else None
            if isinstance(source, str) and _state(source) != _state(name):
                received.add(_state(source))
        for state, names in states.items():
            if state in received:
                continue  # what a loop's local holds now: named there
            name = names[0]
            info = carried[-1][name]
            links = [c.get(name, {}).get("chained") for c in carried[1:]]
            local = " local " in name or not (name.startswith(("return", "self.")))
            holder = state if local else f"{target}: {name}"
            source = info.get("from")
            if local and isinstance(source, str):
                what = f"holds what {target} returns ({source}), and its graph"
            elif local:
                what = f"is a tensor the loop keeps beside {target}, and its graph"
            else:
                what = f"is what {target} {'returns' if name.startswith('return') else 'keeps on self'}, and its graph"
            var = _variable(state) if local else ("hidden" if name.startswith("return") else state.split(".", 1)[-1])
            if not local and not name.startswith("return"):
                var = f"self.{var}"
            out.append(Finding(
                rule="graph-chain", severity="critical",
                title=f"{holder} carries an autograd graph that grows at every call: .detach() it",
                summary=(f"{name} {what}, after each of {len(carried)} calls, reached the one it had "
                         "after the previous call: each call's graph hangs off the previous one, so it "
                         "grows for as long as the program runs."),
                evidence=[f"call {k + 2}: the graph of {name} reaches the previous call's root "
                          f"({c[name].get('walked')} nodes looked at)" for k, c in enumerate(carried[1:])]
                + [f"also chained: {', '.join(names[1:])}"] * (len(names) > 1),
                where=[holder if not local else f"{holder} (beside {target})"],
                root_cause=("State carried from one call to the next keeps its grad_fn: the next call's "
                            "graph hangs off it, so memory (every saved activation) grows for as long as "
                            "the program runs, and a backward would walk all of it "
                            "(`backward(retain_graph=True)` only silences the error that says so)."),
                fix=[*fix_for(var, bool(info.get("scalar"))),
                     "If no backward is needed at all, run the calls under `torch.inference_mode()`."],
                inputs=[g.path], metrics={"holder": holder, "links": links}))
    return out


def check_all(ctx: Context) -> list[Finding]:
    return check(ctx) + _from_calls(ctx)


RULE = Rule("graph-chain", "One held tensor whose autograd graph keeps growing", check_all)
