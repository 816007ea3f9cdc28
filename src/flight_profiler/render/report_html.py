"""One self-contained HTML file: findings, memory / GPU timeline / top-operator charts as inline
SVG. No script, no stylesheet or font from the network: it opens offline."""

from __future__ import annotations

import re
import time
from html import escape

from flight_profiler.rank_list import ranks_label
from flight_profiler.render.report_summary import (
    memory_columns,
    memory_heading,
    memory_rows,
    ordered_fixes,
    perf_rows,
    quiet_text,
)
from flight_profiler.render.safe_report import safe_copy
from flight_profiler.render.svg_charts import busy_timeline, hbars, line_chart, step_chart
from flight_profiler.report.models import Report
from flight_profiler.report.units import fmt_us

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1000px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5}.sev{font-weight:bold;padding:1px 6px;border-radius:3px;color:#fff}
.critical{background:#c62828}.warning{background:#ef6c00}.info{background:#1565c0}
.finding{border:1px solid #ddd;border-left:5px solid #999;padding:6px 12px;margin:10px 0;border-radius:3px}
.finding.c{border-left-color:#c62828}.finding.w{border-left-color:#ef6c00}.finding.i{border-left-color:#1565c0}
code{background:#f3f3f3;padding:0 3px;border-radius:2px}.bad{color:#c62828}
svg.chart{width:100%;height:auto;margin:6px 0}.ct{font-size:13px;font-weight:bold}.tk,.lb,.lg{font-size:11px}
.ax{stroke:#888;stroke-width:1}
"""


_CODE = re.compile(r"`([^`]+)`")


def _rich(text: str) -> str:
    """Escaped text whose `code spans` (as the rules write them) render as <code>."""
    return _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escape(text))


def _table(rows: list[dict[str, str]], cols: list[str]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _charts(report: Report) -> str:
    out = []
    for inp in report.readable:
        if inp.kind != "trace":
            continue
        mem = inp.data.get("memory") or {}
        series = [(f"{dev} allocated", m["series"]) for dev, m in mem.items() if m.get("series")]
        if series:
            out.append(line_chart(series, f"Memory over time: {inp.name}"))
        tl = inp.data.get("gpu_timeline")
        if tl and tl.get("busy_pct"):
            out.append(busy_timeline(tl["busy_pct"], tl["bin_us"],
                                     f"GPU busy (green) / idle (red) over time: {inp.name}"))
        ops = inp.data.get("top_operators") or []
        if ops:
            out.append(hbars([(o["name"], o["self_us"], fmt_us(o["self_us"])) for o in ops[:10]],
                             f"Top operators by self time: {inp.name}"))
        ks = inp.data.get("top_kernels") or []
        if ks:
            out.append(hbars([(k["name"], k["total_us"], fmt_us(k["total_us"])) for k in ks[:10]],
                             f"Top kernels by time: {inp.name}"))
    for s in report.series:
        pts = s["points"]
        labels = [str(p.get("label") or p["path"].rsplit("/", 1)[-1]) for p in pts]
        key = "allocated" if s["kind"] == "snapshot" else "bytes"
        out.append(step_chart(labels, [float(p[key]) for p in pts],
                              f"{'censuses' if s['kind'] == 'census' else 'snapshots'} of pid "
                              f"{s.get('pid')}: memory over time"))
    return "\n".join(x for x in out if x)


def render_html(report: Report) -> str:
    report = safe_copy(report)  # control characters and bidi overrides shown, then HTML-escaped
    P: list[str] = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
                    "<title>flight_profiler report</title>", f"<style>{_CSS}</style></head><body>",
                    "<h1>flight_profiler report</h1>",
                    f"<p>Generated {escape(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(report.created)))}"
                    "</p><ul>"]
    for inp in report.inputs:
        if inp.ok:
            P.append(f"<li><code>{escape(inp.path)}</code>: {escape(inp.kind)}"
                     + (f", rank {inp.rank}" if inp.rank is not None else "") + "</li>")
        else:
            P.append(f"<li class=\"bad\"><code>{escape(inp.path)}</code>: not read: {escape(str(inp.error))}</li>")
    P.append("</ul><h2>Problem Summary</h2>")
    problems = [f for f in report.findings if f.severity != "info"]
    if problems:
        P.append("<table><tr><th>severity</th><th>rule</th><th>finding</th></tr>")
        for f in problems:
            P.append(f"<tr><td><span class=\"sev {f.severity}\">{f.severity}</span></td>"
                     f"<td><code>{escape(f.rule)}</code></td><td>{_rich(f.summary)}</td></tr>")
        P.append("</table>")
    else:
        P.append(f"<p>{_rich(quiet_text(report))}</p>")
    P.append(f"<h2>{escape(memory_heading(report))}</h2>")
    mem = memory_rows(report)
    P.append(_table(mem, memory_columns(mem)) or "<p>No memory data in these inputs.</p>")
    P.append("<h2>Performance Analysis</h2>")
    perf = perf_rows(report)
    P.append(_table(perf, list(perf[0].keys())) if perf else "<p>No trace among the inputs.</p>")
    P.append(_charts(report))
    P.append("<h2>Evidence Chain</h2>")
    for f in report.findings:
        cls = f.severity[0]
        P.append(f"<div class=\"finding {cls}\"><p><span class=\"sev {f.severity}\">{f.severity}</span> "
                 f"<code>{escape(f.rule)}</code> "
                 + (f"[{escape(ranks_label(f.ranks))}] " if f.ranks is not None else "")
                 + f"<b>{_rich(f.title)}</b></p><p>{_rich(f.summary)}</p>")
        if f.cost is not None:
            P.append(f"<p>Cost: {f.cost.pct:.1f}% of {escape(f.cost.of)} ({f.cost.us / 1000:.2f} ms), "
                     f"estimated as {escape(f.cost.method)}.</p>")
        if f.evidence:
            P.append("<ul>" + "".join(f"<li>{_rich(e)}</li>" for e in f.evidence) + "</ul>")
        if f.where:
            P.append("<p>Where:</p><ul>" + "".join(f"<li><code>{escape(w)}</code></li>" for w in f.where)
                     + "</ul>")
        P.append("</div>")
    if not report.findings:
        P.append("<p>Nothing to show.</p>")
    P.append("<h2>Root Cause</h2><ul>")
    for f in problems:
        if f.root_cause:
            P.append(f"<li><b>{escape(f.rule)}</b>: {_rich(f.root_cause)}</li>")
    P.append("</ul><h2>Recommendations</h2><ol>")
    for rule, fix in ordered_fixes(report):
        P.append(f"<li>{_rich(fix)} <i>({escape(rule)})</i></li>")
    P.append("</ol></body></html>\n")
    return "".join(P)
