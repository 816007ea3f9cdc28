"""``flight_profiler report FILE...``: diagnose traces, snapshots and censuses (offline, no torch)."""

from __future__ import annotations

import sys
from typing import Any

import click

from flight_profiler.errors import BadInputFile, FindingsThreshold, cannot_write
from flight_profiler.rank_list import format_ranks
from flight_profiler.report.models import SEVERITIES, SEVERITY_RANK
from flight_profiler.safe_text import safe_text

_EPILOG = """\b
Inputs are recognised by content: Chrome traces (.json, .json.gz, TensorBoard
profiler directories), memory snapshot pickles (loaded without running code),
tensor censuses. Several snapshots/censuses of one process are compared over time.
Per-rank files of a distributed job (traces, snapshots, stack files; a directory
from `diagnose --all-ranks`, or one gathered from many nodes) are compared across
ranks: hang, desync, straggler, imbalance (docs/ranks.md).

\b
Examples:
  flight_profiler report trace.json.gz
  flight_profiler report logs/profiler/ --format html -o report.html
  flight_profiler report snap1.pickle snap2.pickle census*.json --json
  flight_profiler report trace.json.gz --fail-on warning   (CI: exit 9 on findings)
  flight_profiler report --diff before.json.gz after.json.gz   (what a fix changed)

\b
Exit codes: 0 done (some files may be unreadable: they are listed), 8 no input
could be read, 9 a finding reached --fail-on, 2 usage. Rules: docs/report-rules.md.
"""


_HINT = "Pass Chrome traces (.json/.json.gz), snapshot pickles or tensor census files."


def _printable(path: str) -> str:
    """A path on one line: a newline in a file name must not split the message."""
    return path if path.isprintable() else repr(path)[1:-1]


@click.command("report", epilog=_EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["md", "json", "html"]),
              help="Output format (default: tables in the terminal; with -o, from its extension).")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Write the report to this file instead of the terminal.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--fail-on", type=click.Choice(SEVERITIES),
              help="Exit with code 9 when a finding of this severity or worse is found.")
@click.option("--diff", "diff", is_flag=True,
              help="Compare two inputs, BEFORE AFTER (traces, snapshots or censuses): per-step, operator, "
                   "kernel and memory changes with a verdict.")
def report(files: tuple[str, ...], fmt: str | None, output: str | None, as_json: bool,
           fail_on: str | None, diff: bool) -> None:
    """Diagnose FILE... against the known PyTorch problem patterns."""
    from flight_profiler.render.formats import render_report, write_report
    from flight_profiler.report import analyze

    if as_json:
        fmt = "json"
    if diff:
        _diff(files, fmt, output)
        return
    result = _analyze(list(files), analyze)
    if not result.readable and len(result.errors) == 1:
        # One unreadable input: its reason is the error itself, said once.
        (bad,) = result.errors
        raise BadInputFile(f"{_printable(bad.path)}: {bad.error}", _HINT)
    for bad in result.errors:
        click.echo(f"warning: {_printable(bad.path)}: {safe_text(bad.error)}", err=True)
    if not result.readable:
        names = ", ".join(_printable(b.path) for b in result.errors[:5]) or "no input"
        more = f" and {len(result.errors) - 5} more" if len(result.errors) > 5 else ""
        raise BadInputFile(f"no input could be read ({names}{more})", _HINT)
    if output:
        try:
            written = write_report(result, output, fmt)
        except OSError as exc:
            raise cannot_write(output, exc) from None
        click.echo(f"wrote {written} report to {output}", err=True)
    elif fmt:
        sys.stdout.write(render_report(result, fmt))
    else:
        from flight_profiler.render.report_terminal import print_report

        print_report(result)
    if fail_on and result.reaches(fail_on):
        n = sum(1 for f in result.findings if SEVERITY_RANK[f.severity] >= SEVERITY_RANK[fail_on])
        raise FindingsThreshold(f"{n} finding(s) at or above {fail_on} (--fail-on {fail_on})",
                                "See the report above; fix them or raise --fail-on.")


def _analyze(files: list[str], analyze: Any) -> Any:
    """One node's directory or files: the report of them. Several nodes' directories of one job
    (``report DIR1 DIR2``, or ``report PARENT`` with a directory per node): the merged job
    report (report/job_merge.py)."""
    from flight_profiler.report.job_merge import merge_node_dirs, merged_report, node_dirs

    dirs = node_dirs(files)
    if dirs is None:
        return analyze(files)
    merged = merge_node_dirs(dirs)
    for path, why in merged.skipped:
        click.echo(f"warning: {_printable(path)}: {safe_text(why)}: skipped", err=True)
    if merged.missing:
        click.echo(f"note: rank(s) {format_ranks(merged.missing)} of {merged.world_size} are in no "
                   "node directory (dead, or their node's directory was not passed)", err=True)
    return merged_report(merged)


def _diff(files: tuple[str, ...], fmt: str | None, output: str | None) -> None:
    import json

    from flight_profiler.errors import UsageError
    from flight_profiler.report.diff import DiffError, compare

    if len(files) != 2:
        raise UsageError(f"--diff takes exactly two inputs, BEFORE AFTER (got {len(files)})",
                         "e.g. `flight_profiler report --diff before.json.gz after.json.gz`")
    try:
        result = compare(files[0], files[1])
    except DiffError as exc:
        raise BadInputFile(f"cannot compare: {exc}", "Pass two traces, two snapshots or two censuses.") from None
    if fmt == "html":
        raise UsageError("--diff has no HTML view", "use --format md or --json")
    if fmt == "json" or (output and output.endswith(".json")):
        text = json.dumps(result.to_dict(), indent=2) + "\n"
    elif fmt == "md" or output:
        from flight_profiler.render.diff_view import diff_markdown

        text = diff_markdown(result)
    else:
        from flight_profiler.render.diff_view import print_diff

        print_diff(result)
        return
    if output:
        from flight_profiler.atomic_files import write_text_atomic

        try:
            write_text_atomic(output, text)
        except OSError as exc:
            raise cannot_write(output, exc) from None
        click.echo(f"wrote diff to {output}", err=True)
    else:
        sys.stdout.write(text)
