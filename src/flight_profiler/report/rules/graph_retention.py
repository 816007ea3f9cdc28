"""graph-retention: tensors that carry an autograd graph (grad_fn) kept alive across steps.

``losses.append(loss)`` keeps every step's whole backward graph (activations included) alive.
From several censuses: holders whose grad_fn tensors (or graph bytes) keep growing. From one
census: a container holding many grad_fn tensors (a warning: it is the usual shape of the bug).
"""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

CONTAINERS = ("list", "dict", "deque", "set", "tuple", "OrderedDict", "defaultdict")


def _where(h: dict[str, str]) -> str:
    if h["path"].startswith("<"):
        # The census found no path from a module global: a running function's local, a closure
        # or a C++ structure holds them.
        return (f"{h['path']}: not reachable from any module global (a local variable of a "
                "running function, a closure, or an object only C++ references)")
    return f"{h['path']} (e.g. {h['example']})"


def _fix(path: str) -> list[str]:
    return [
        f"Where `{path}` is filled, store `loss.item()` or `t.detach()` instead of the tensor "
        "itself (e.g. `history.append(loss.item())`).",
        "Compute metrics under `torch.no_grad()` so that they carry no graph.",
        "If the tensor must be kept with its graph, keep only the last one (not one per step).",
    ]


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    named: set[str] = set()
    for series in ctx.census_series:
        first = {h["path"]: h for h in series[0].data["holders"]}
        per_path = {h["path"]: [h] for h in series[0].data["holders"]}
        for c in series[1:]:
            for h in c.data["holders"]:
                per_path.setdefault(h["path"], []).append(h)
        for h in series[-1].data["holders"]:
            hist = per_path.get(h["path"], [h])
            before = first.get(h["path"], {"with_grad_fn": 0, "graph_bytes": 0, "count": 0})
            grads = [x["with_grad_fn"] for x in hist]
            grows = h["with_grad_fn"] - before["with_grad_fn"] >= T.graph_growth_min_count and all(
                b >= a for a, b in zip(grads, grads[1:]))
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
                                                for x in c.data["holders"] if x["path"] == h["path"]),
                                               "not present") for c in series],
                where=[_where(h)], fix=_fix(h["path"]),
                inputs=[c.path for c in series],
                root_cause=("Each stored tensor references its grad_fn, which references the "
                            "activations saved for backward: the whole graph of every step stays "
                            "in memory."),
                metrics={"holder": h["path"], "with_grad_fn": grads,
                         "graph_bytes": [x["graph_bytes"] for x in hist]},
            ))
    for c in ctx.censuses:
        for h in c.data["holders"]:
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
                where=[_where(h)], fix=_fix(h["path"]),
                inputs=[c.path],
                root_cause="A container accumulates tensors that still reference their graphs.",
                metrics={"holder": h["path"], "with_grad_fn": h["with_grad_fn"],
                         "graph_bytes": h["graph_bytes"]},
            ))
    return out


RULE = Rule("graph-retention", "Autograd graphs kept alive across steps", check)
