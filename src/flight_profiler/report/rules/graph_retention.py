"""graph-retention: tensors that carry an autograd graph (grad_fn) kept alive across steps.

``losses.append(loss)`` keeps every step's whole backward graph (activations included) alive.
From several censuses: holders whose grad_fn tensors (or graph bytes) keep growing. From one
census: a container holding many grad_fn tensors (a warning: it is the usual shape of the bug).
Holders are judged per container (per-key paths such as ``cache['req-886']`` fold into
``cache[*]``). Tensors bigger than scalars kept with graphs are model outputs: inference run with
autograd on, fixed with ``torch.inference_mode()`` / ``torch.no_grad()``.
"""

from __future__ import annotations

import re
from typing import Any

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

CONTAINERS = ("list", "dict", "deque", "set", "tuple", "OrderedDict", "defaultdict")
# A tensor bigger than this (bytes per tensor on average) is an output or an activation, not a
# scalar loss: the fix is to produce it without a graph, not to store .item().
OUTPUT_MIN_BYTES = 64
# Keys that hold digits are per-request/per-step keys: censuses written before the census folded
# them are folded here, so growth is judged per container.
_KEYED = re.compile(r"\['[^'\]]*\d[^'\]]*'\]|\[\d+\]")
_SUM = ("count", "bytes", "with_grad_fn", "graph_bytes")


def fold_holders(holders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Holders with per-key paths (``cache['req-886']``) merged into their container's row."""
    out: dict[str, dict[str, Any]] = {}
    for h in holders:
        path = _KEYED.sub("[*]", str(h.get("path", "")))
        row = out.get(path)
        if row is None:
            out[path] = {**h, "path": path}
            continue
        for k in _SUM:
            row[k] = int(row.get(k, 0) or 0) + int(h.get(k, 0) or 0)
    return list(out.values())


def _is_outputs(h: dict[str, Any]) -> bool:
    n = int(h.get("with_grad_fn") or 0)
    return n > 0 and int(h.get("bytes") or 0) / max(1, int(h.get("count") or 1)) > OUTPUT_MIN_BYTES


def _where(h: dict[str, Any]) -> str:
    if h["path"].startswith("<"):
        # The census walks module globals, every thread's running functions and closures:
        # what it cannot reach is held by C++ (autograd graphs, extensions) or __slots__ objects.
        return (f"{h['path']}: not reachable from any module global, running function's local "
                "or closure (held from C++ or by an object with __slots__ only)")
    return f"{h['path']} (e.g. {h.get('example', h['path'])})"


def _fix(h: dict[str, Any]) -> list[str]:
    path = h["path"]
    place = ("where these tensors are stored" if path.startswith("<")
             else f"where `{path}` is filled")
    graph = int(h.get("graph_bytes") or 0)
    kept = f" ({fmt_bytes(graph)} of graph kept alive here)" if graph else ""
    no_grad = (f"Produce them without a graph: run the model under `with torch.inference_mode():` "
               f"(or `torch.no_grad()`) {place}; outputs then carry no grad_fn{kept}.")
    detach = (f"{place[0].upper()}{place[1:]}, store `loss.item()` or `t.detach()` instead of the "
              "tensor itself (e.g. `history.append(loss.item())`).")
    if _is_outputs(h):
        # Model outputs kept with their graphs: inference (or evaluation) run with autograd on.
        return [no_grad, detach.replace("`loss.item()` or ", ""),
                "If gradients are really needed later, keep only the last output, not one per call."]
    return [detach, "Compute metrics under `torch.no_grad()` so that they carry no graph.",
            "If the tensor must be kept with its graph, keep only the last one (not one per step)."]


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    named: set[str] = set()
    for series in ctx.census_series:
        folded = [fold_holders(c.data["holders"]) for c in series]
        first = {h["path"]: h for h in folded[0]}
        per_path = {h["path"]: [h] for h in folded[0]}
        for rows in folded[1:]:
            for h in rows:
                per_path.setdefault(h["path"], []).append(h)
        for h in folded[-1]:
            hist = per_path.get(h["path"], [h])
            before = first.get(h["path"], {"with_grad_fn": 0, "graph_bytes": 0, "count": 0})
            grads = [x["with_grad_fn"] for x in hist]
            more = h["with_grad_fn"] - before["with_grad_fn"]
            # Many more graph-carrying tensors, or a few that keep a lot of graph alive.
            grows = (more >= T.graph_growth_min_count
                     or (more >= 1 and h["graph_bytes"] - before["graph_bytes"] >= T.growth_min_bytes)) \
                and all(b >= a for a, b in zip(grads, grads[1:]))
            if not grows or h["with_grad_fn"] == 0:
                continue
            gb = h["graph_bytes"] - before["graph_bytes"]
            sev = "critical" if len(series) >= 3 or gb >= T.growth_min_bytes else "warning"
            named.add(h["path"])
            out.append(Finding(
                rule="graph-retention", severity=sev,
                title=f"{h['path']} keeps tensors with autograd graphs, more at every census",
                summary=(f"{h['path']} ({h['kind']}) held {before['with_grad_fn']} -> "
                         f"{h['with_grad_fn']} tensors with grad_fn across {len(series)} censuses; "
                         f"graph memory kept alive {fmt_bytes(before['graph_bytes'])} -> "
                         f"{fmt_bytes(h['graph_bytes'])}."),
                evidence=[f"{c.name}: " + next((f"{x['count']} tensors, {x['with_grad_fn']} with "
                                                f"grad_fn, {fmt_bytes(x['bytes'])} + graph "
                                                f"{fmt_bytes(x['graph_bytes'])}"
                                                for x in rows if x["path"] == h["path"]),
                                               "not present") for c, rows in zip(series, folded)],
                where=[_where(h)], fix=_fix({**h, "graph_bytes": gb}),
                inputs=[c.path for c in series],
                root_cause=("Each stored tensor references its grad_fn, which references the "
                            "activations saved for backward: the whole graph of every step stays "
                            "in memory."),
                metrics={"holder": h["path"], "with_grad_fn": grads,
                         "graph_bytes": [x["graph_bytes"] for x in hist]},
            ))
    for c in ctx.censuses:
        for h in fold_holders(c.data["holders"]):
            if h["path"] in named or h["kind"] not in CONTAINERS:
                continue
            if h["with_grad_fn"] < T.graph_holder_min_count:
                continue
            named.add(h["path"])
            out.append(Finding(
                rule="graph-retention", severity="warning",
                title=f"{h['path']} holds {h['with_grad_fn']} tensors that carry autograd graphs",
                summary=(f"{c.name}: the {h['kind']} {h['path']} holds {h['count']} tensors, "
                         f"{h['with_grad_fn']} of them with grad_fn ({fmt_bytes(h['bytes'])} of "
                         f"data, {fmt_bytes(h['graph_bytes'])} kept alive by their graphs)."),
                evidence=[f"holder {h['path']}: count {h['count']}, with_grad_fn {h['with_grad_fn']}, "
                          f"graph_bytes {h['graph_bytes']}",
                          "A second census later shows whether it grows (then it is a leak)."],
                where=[_where(h)], fix=_fix(h),
                inputs=[c.path],
                root_cause="A container accumulates tensors that still reference their graphs.",
                metrics={"holder": h["path"], "with_grad_fn": h["with_grad_fn"],
                         "graph_bytes": h["graph_bytes"]},
            ))
    return out


RULE = Rule("graph-retention", "Autograd graphs kept alive across steps", check)
