"""The one way a report becomes a file or a text: a dispatcher by format (md, json, html).

A report is plain data (report/models.py) and knows nothing of its views; the CLI and the
diagnosis both come here to render or write it.
"""

from __future__ import annotations

import os

from flight_profiler.atomic_files import write_text_atomic
from flight_profiler.render.report_html import render_html
from flight_profiler.render.report_md import render_markdown
from flight_profiler.report.models import Report

FORMATS = ("md", "json", "html")
_EXTENSIONS = {".md": "md", ".json": "json", ".html": "html", ".htm": "html"}


def format_of(path: str, fmt: str | None = None) -> str:
    """``fmt`` if given, else the one the file's extension names (Markdown when none does)."""
    if fmt is not None:
        return fmt
    return _EXTENSIONS.get(os.path.splitext(path)[1].lower(), "md")


def render_report(report: Report, fmt: str) -> str:
    """The report as text in ``fmt``: md | json | html."""
    if fmt == "json":
        return report.to_json() + "\n"
    if fmt == "md":
        return render_markdown(report)
    if fmt == "html":
        return render_html(report)
    raise ValueError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")


def write_report(report: Report, path: str, fmt: str | None = None) -> str:
    """Write the report atomically; returns the format used (``fmt`` or the extension's)."""
    fmt = format_of(path, fmt)
    write_text_atomic(path, render_report(report, fmt))
    return fmt
