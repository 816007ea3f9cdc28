"""Tiny inline-SVG charts (no JavaScript, no network): line, bar timeline, horizontal bars."""

from __future__ import annotations

from html import escape

from flight_profiler.report.units import fmt_bytes, fmt_us

W, H, PAD = 720, 200, 84
# Characters of 11px text that fit across the chart (about 6 px each).
LINE_CHARS = 115


def _fit(label: str, limit: int) -> str:
    """Shorten only past ``limit``, keeping both ends (operator and kernel names differ at the
    end as often as at the start); the full text stays in the element's tooltip."""
    if len(label) <= limit:
        return label
    half = (limit - 1) // 2
    return label[:half] + "…" + label[-(limit - 1 - half):]


def _lines(label: str, per_line: int = LINE_CHARS, most: int = 3) -> list[str]:
    """A long label wrapped over up to ``most`` lines (then shortened in the middle)."""
    label = _fit(label, per_line * most)
    return [label[i:i + per_line] for i in range(0, len(label), per_line)] or [""]


def line_chart(series: list[tuple[str, list[list[float]]]], title: str) -> str:
    """series: (label, [[x_us, bytes], ...]); x from 0."""
    pts_all = [p for _, pts in series for p in pts]
    if not pts_all:
        return ""
    xmax = max(p[0] for p in pts_all) or 1.0
    ymin = min(p[1] for p in pts_all)
    ymax = max(p[1] for p in pts_all)
    if ymax == ymin:
        ymax = ymin + 1
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H + 30}" role="img" aria-label="{escape(title)}">',
             f'<text x="{PAD}" y="14" class="ct">{escape(title)}</text>']
    parts.append(_axes(fmt_bytes(ymin), fmt_bytes(ymax), "0", fmt_us(xmax)))
    for k, (lab, pts) in enumerate(series):
        coords = " ".join(
            f"{PAD + (W - PAD - 10) * p[0] / xmax:.1f},{H - (H - 30) * (p[1] - ymin) / (ymax - ymin):.1f}"
            for p in pts)
        c = colors[k % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{coords}"/>')
        # The legend goes under the title, from the left: a right-hand legend ran off the chart.
        parts.append(f'<text x="{PAD + 8}" y="{30 + 14 * k}" fill="{c}" class="lg">'
                     f'{escape(_fit(lab, LINE_CHARS - 16))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def step_chart(labels: list[str], values: list[float], title: str) -> str:
    """Points in order (snapshots/censuses over time), as a line with markers."""
    if not values:
        return ""
    vmax = max(values) or 1.0
    n = len(values)
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H + 30}" role="img" aria-label="{escape(title)}">',
             f'<text x="{PAD}" y="14" class="ct">{escape(title)}</text>',
             _axes("0", fmt_bytes(vmax), _fit(labels[0], 50), _fit(labels[-1], 50) if n > 1 else "")]
    xy = [(PAD + (W - PAD - 20) * (i / max(1, n - 1)), H - (H - 30) * v / vmax) for i, v in enumerate(values)]
    parts.append('<polyline fill="none" stroke="#d62728" stroke-width="2" points="'
                 + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>')
    for (x, y), v, lab in zip(xy, values, labels):
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#d62728"><title>{escape(lab)}: '
                     f'{fmt_bytes(v)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def busy_timeline(busy_pct: list[float], bin_us: float, title: str) -> str:
    if not busy_pct:
        return ""
    n = len(busy_pct)
    bw = (W - PAD - 10) / n
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H + 30}" role="img" aria-label="{escape(title)}">',
             f'<text x="{PAD}" y="14" class="ct">{escape(title)}</text>',
             _axes("0%", "100%", "0", fmt_us(bin_us * n))]
    for i, pct in enumerate(busy_pct):
        h = (H - 30) * min(pct, 100.0) / 100.0
        x = PAD + i * bw
        parts.append(f'<rect x="{x:.1f}" y="{H - h:.1f}" width="{max(bw - 0.3, 0.5):.1f}" '
                     f'height="{h:.1f}" fill="#2ca02c"><title>{fmt_us(i * bin_us)}: {pct:.0f}% busy'
                     '</title></rect>')
        if h < H - 30:
            parts.append(f'<rect x="{x:.1f}" y="30" width="{max(bw - 0.3, 0.5):.1f}" '
                         f'height="{H - 30 - h:.1f}" fill="#f2d0d0"/>')
    parts.append("</svg>")
    return "".join(parts)


def hbars(rows: list[tuple[str, float, str]], title: str) -> str:
    """rows: (label, value, value text)."""
    if not rows:
        return ""
    vmax = max(v for _, v, _ in rows) or 1.0
    bar, line = 13, 13
    body: list[str] = []
    y = 22
    for lab, v, txt in rows:
        # The name on its own line(s) across the chart, the bar under it: names are not cut.
        for k, part in enumerate(_lines(lab)):
            body.append(f'<text x="4" y="{y + 11 + k * line}" class="lb">{escape(part)}</text>')
        y += line * len(_lines(lab))
        w = (W - 120) * v / vmax
        body.append(f'<rect x="4" y="{y + 1}" width="{max(w, 1):.1f}" height="{bar - 2}" fill="#1f77b4">'
                    f'<title>{escape(lab)}</title></rect>')
        body.append(f'<text x="{8 + w:.1f}" y="{y + 10}" class="lb">{escape(txt)}</text>')
        y += bar + 5
    parts = [f'<svg class="chart" viewBox="0 0 {W} {y + 4}" role="img" aria-label="{escape(title)}">',
             f'<text x="4" y="14" class="ct">{escape(title)}</text>', *body, "</svg>"]
    return "".join(parts)


def _axes(ylo: str, yhi: str, xlo: str, xhi: str) -> str:
    return (f'<line x1="{PAD}" y1="{H}" x2="{W - 10}" y2="{H}" class="ax"/>'
            f'<line x1="{PAD}" y1="30" x2="{PAD}" y2="{H}" class="ax"/>'
            f'<text x="{PAD - 4}" y="{H}" class="tk" text-anchor="end">{escape(ylo)}</text>'
            f'<text x="{PAD - 4}" y="36" class="tk" text-anchor="end">{escape(yhi)}</text>'
            f'<text x="{PAD}" y="{H + 14}" class="tk">{escape(xlo)}</text>'
            f'<text x="{W - 10}" y="{H + 14}" class="tk" text-anchor="end">{escape(xhi)}</text>')
