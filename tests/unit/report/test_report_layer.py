"""report/ is plain analysis: it imports no view (render/) and no command (cli/), not even
inside a function, so that a report can never render itself again (no report <-> render cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "flight_profiler"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((SRC / package).rglob("*.py")):
        bad = sorted(n for n in _imports(path)
                     if any(n == f or n.startswith(f + ".") for f in forbidden))
        if bad:
            found[str(path.relative_to(SRC))] = bad
    return found


def test_report_imports_neither_render_nor_cli() -> None:
    files = list((SRC / "report").rglob("*.py"))
    assert len(files) > 10  # the walk sees the package (and its rules/)
    assert _offenders("report", ("flight_profiler.render", "flight_profiler.cli")) == {}


def test_render_imports_no_command() -> None:
    assert _offenders("render", ("flight_profiler.cli",)) == {}


def test_the_views_and_the_cli_take_the_severity_order_from_the_report() -> None:
    from flight_profiler.cli.diagnose_cmd import diagnose
    from flight_profiler.cli.report_cmd import report
    from flight_profiler.report.models import SEVERITIES

    for command in (report, diagnose):
        fail_on = next(p for p in command.params if p.name == "fail_on")
        assert tuple(fail_on.type.choices) == SEVERITIES  # type: ignore[attr-defined]
