"""hot-operators (info): where the time goes, top operators by self time and kernels by time."""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.units import fmt_us


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for tr in ctx.traces:
        ops = tr.data.get("top_operators") or []
        kernels = tr.data.get("top_kernels") or []
        if not ops and not kernels:
            continue
        evidence = [f"op {o['name']}: self {fmt_us(o['self_us'])}, {o['calls']} calls" for o in ops[:5]]
        evidence += [f"kernel {k['name'][:100]}: {fmt_us(k['total_us'])}, {k['calls']} calls"
                     for k in kernels[:5]]
        first = (ops or kernels)[0]
        out.append(Finding(
            rule="hot-operators", severity="info",
            title="Top operators and kernels",
            summary=(f"{label(tr)}: the costliest operator by self time is {first['name'][:80]}"
                     + (f" ({fmt_us(first.get('self_us', first.get('total_us')))})") + "."),
            evidence=evidence,
            where=[o["name"] for o in ops[:3]] + [k["name"][:100] for k in kernels[:3]],
            fix=["Optimise from the top of this table down; a faster op elsewhere changes nothing."],
            inputs=[tr.path], root_cause="",
            metrics={"top_operators": ops, "top_kernels": kernels},
        ))
    return out


RULE = Rule("hot-operators", "Where the time goes", check)
