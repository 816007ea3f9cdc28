"""graph-retention: tensors that carry an autograd graph (grad_fn) kept alive across steps.

``losses.append(loss)`` keeps every step's whole backward graph (activations included) alive.
From several censuses: holders whose grad_fn tensors (or graph bytes) grow at every census and
accumulate (census_growth.py: three censuses or more, not capped, still holding what they held,
a running function's local seen to outlive its call). From one census: a container holding many
grad_fn tensors (a warning: it is the usual shape of the bug), unless it is a running function's
local not seen to survive (a forward's per-timestep outputs) or the method's own return value.
Holders are judged per container (per-key paths such as ``cache['req-886']`` fold into
``cache[*]``). Tensors bigger than scalars kept with graphs are model outputs: inference run with
autograd on, fixed with ``torch.inference_mode()`` / ``torch.no_grad()``.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report import census_growth
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

CONTAINERS = ("list", "dict", "deque", "set", "tuple", "OrderedDict", "defaultdict")
# A tensor bigger than this (bytes per tensor on average) is an output or an activation, not a
# scalar loss: the fix is to produce it without a graph, not to store .item().
OUTPUT_MIN_BYTES = 64
fold_holders = census_growth.fold_holders  # where memory_leak and older callers find it


def _scalars(h: dict[str, Any]) -> bool:
    """One element a tensor (losses, metrics), whatever their storage: a 0-d loss from
    F.mse_loss keeps its batch-sized buffer (196 KiB for 64 x 784 floats), which made a
    Lightning module's `self.losses.append(loss)` read as model outputs (censuses before the
    element count was written say nothing: False)."""
    numel, count = h.get("numel"), int(h.get("count") or 0)
    return isinstance(numel, int) and count > 0 and numel <= count


def _is_outputs(h: dict[str, Any]) -> bool:
    n = int(h.get("with_grad_fn") or 0)
    return (n > 0 and not _scalars(h)
            and int(h.get("bytes") or 0) / max(1, int(h.get("count") or 1)) > OUTPUT_MIN_BYTES)


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
    fixes = [detach, "Compute metrics under `torch.no_grad()` so that they carry no graph.",
             "If the tensor must be kept with its graph, keep only the last one (not one per step)."]
    per = int(h.get("bytes") or 0) // max(1, int(h.get("count") or 1))
    if _scalars(h) and per > OUTPUT_MIN_BYTES:
        fixes.insert(1, f"Each of these one-element tensors keeps {fmt_bytes(per)} of storage alive "
                        "(a loss from `F.mse_loss` shares its batch-sized buffer): `.item()` frees it, "
                        "`.detach()` alone does not.")
    return fixes


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    named: set[str] = set()
    for series in ctx.census_series:
        out += _growth(series, named)
    for c in ctx.censuses:
        out += _one_census(c, named)
    return out


def _growth(series: list[Any], named: set[str]) -> list[Finding]:
    """Holders whose graph-carrying tensors grow at every census and accumulate
    (census_growth.py); a pair of censuses gives an info finding only."""
    out: list[Finding] = []
    few = len(series) < census_growth.MIN_POINTS
    for h in census_growth.histories(series):
        if h.rows[-1] is None or int(h.last["with_grad_fn"]) == 0:
            continue
        grads = h.series("with_grad_fn")
        graph = h.series("graph_bytes")
        more = grads[-1] - grads[0]
        # Many more graph-carrying tensors, or a few that keep a lot of graph alive.
        big = more >= T.graph_growth_min_count or (more >= 1 and graph[-1] - graph[0] >= T.growth_min_bytes)
        if not big or not census_growth.growing(grads) or census_growth.why_not_accumulating(h):
            continue
        last = h.last
        first = h.rows[0] or {"with_grad_fn": 0, "graph_bytes": 0}
        gb = graph[-1] - graph[0]
        named.add(h.path)
        out.append(Finding(
            rule="graph-retention", severity="info" if few else "critical",
            title=(f"{h.path} keeps more tensors with autograd graphs: "
                   + ("a third census tells whether it goes on" if few else "more at every census")),
            summary=(f"{h.path} ({last['kind']}) held {first['with_grad_fn']} -> "
                     f"{last['with_grad_fn']} tensors with grad_fn across {len(series)} censuses; "
                     f"graph memory kept alive {fmt_bytes(graph[0])} -> {fmt_bytes(graph[-1])}."),
            evidence=[f"{c.name}: " + (f"{r['count']} tensors, {r['with_grad_fn']} with grad_fn, "
                                       f"{fmt_bytes(r['bytes'])} + graph {fmt_bytes(r['graph_bytes'])}"
                                       + _kept_text(r) if r is not None else "not present")
                      for c, r in zip(series, h.rows)]
            + ([census_growth_pair_note()] if few else []),
            where=[_where(last)], fix=_fix({**last, "graph_bytes": gb}),
            inputs=[c.path for c in series],
            root_cause=("Each stored tensor references its grad_fn, which references the "
                        "activations saved for backward: the whole graph of every step stays "
                        "in memory."),
            metrics={"holder": h.path, "with_grad_fn": grads, "graph_bytes": graph},
        ))
    return out


def census_growth_pair_note() -> str:
    return ("Two censuses cannot tell a container that keeps growing from one caught at two "
            "moments of a step: a third census tells.")


def _kept_text(r: dict[str, Any]) -> str:
    if "kept" in r and r.get("sampled"):
        return f" ({r['kept']} of {r['sampled']} tensors seen at the previous census still held)"
    return ""


def _one_census(c: Any, named: set[str]) -> list[Finding]:
    """One census: a container holding many graph-carrying tensors (the usual shape of the bug),
    unless it is a running function's local not seen to outlive its call (a forward's list of
    per-timestep outputs) or the value the method had just returned."""
    out: list[Finding] = []
    tracked = bool(c.data.get("census_id"))
    for h in fold_holders(c.data["holders"]):
        if h["path"] in named or h["kind"] not in CONTAINERS:
            continue
        if h["with_grad_fn"] < T.graph_holder_min_count:
            continue
        root = census_growth.root_of(h)
        if root == "return" or (root == "local" and tracked and census_growth.kept_alive(h) is not True):
            continue
        capped = h.get("cap") is not None and int(h.get("length", 0) or 0) <= int(h["cap"])
        named.add(h["path"])
        out.append(Finding(
            rule="graph-retention", severity="info" if capped else "warning",
            title=f"{h['path']} holds {h['with_grad_fn']} tensors that carry autograd graphs",
            summary=(f"{c.name}: the {h['kind']} {h['path']} holds {h['count']} tensors, "
                     f"{h['with_grad_fn']} of them with grad_fn ({fmt_bytes(h['bytes'])} of "
                     f"data, {fmt_bytes(h['graph_bytes'])} kept alive by their graphs)"
                     + (f"; it is capped at {h['cap']} entries, so this is bounded." if capped else ".")),
            evidence=[f"holder {h['path']}: count {h['count']}, with_grad_fn {h['with_grad_fn']}, "
                      f"graph_bytes {h['graph_bytes']}" + _kept_text(h),
                      "A second census later shows whether it grows (then it is a leak)."],
            where=[_where(h)], fix=_fix(h),
            inputs=[c.path],
            root_cause="A container accumulates tensors that still reference their graphs.",
            metrics={"holder": h["path"], "with_grad_fn": h["with_grad_fn"],
                     "graph_bytes": h["graph_bytes"]},
        ))
    return out


RULE = Rule("graph-retention", "Autograd graphs kept alive across steps", check)
