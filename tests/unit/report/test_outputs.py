"""Markdown / JSON / HTML / terminal outputs, the CLI options and exit codes."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from flight_profiler.cli.report_cmd import report as report_cmd
from flight_profiler.errors import ExitCode, FindingsThreshold
from flight_profiler.render.formats import render_report, write_report
from flight_profiler.report import SCHEMA_VERSION, analyze
from support import TRACES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
INPUTS = [str(FIXTURES / "cpu_leak.json.gz"), str(TRACES / "gpu_train_test.json.gz")]


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    return analyze(INPUTS)


def test_markdown_has_the_diagnosis_structure(report) -> None:  # type: ignore[no-untyped-def]
    md = render_report(report, "md")
    heads = re.findall(r"^## (.+)$", md, re.M)
    assert heads == ["Problem Summary", "GPU Memory State", "Performance Analysis", "Evidence Chain",
                     "Root Cause", "Recommendations"]
    assert "`memory-leak`" in md and "`sync-bottleneck`" in md
    assert "aten::_local_scalar_dense" in md  # key operations table


def test_json_carries_schema_version_findings_and_metrics(report) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(render_report(report, "json"))
    assert doc["schema_version"] == SCHEMA_VERSION
    gpu = next(i for i in doc["inputs"] if i["path"].endswith("gpu_train_test.json.gz"))
    assert gpu["rank"] == 1
    b = gpu["metrics"]["gpu_time_breakdown"]
    assert {"idle_pct", "compute_pct", "non_compute_pct"} <= set(b)
    for key in ("kernels", "memcpy", "sync", "steps"):
        assert key in gpu["metrics"]
    assert gpu["metrics"]["steps"]["count"] == 6
    for f in doc["findings"]:
        assert set(f) >= {"rule", "severity", "title", "evidence", "where", "fix"}
    assert doc["summary"]["worst_severity"] == "critical"


def test_html_is_self_contained_with_charts(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.html"
    assert write_report(report, str(out)) == "html"
    html = out.read_text()
    assert html.count("<svg") >= 3  # memory, top operators, GPU timeline
    assert "<script" not in html
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html)
    assert "memory-leak" in html


def test_cli_default_prints_tables_and_fail_on_sets_exit_code() -> None:
    runner = CliRunner()
    res = runner.invoke(report_cmd, [str(FIXTURES / "cpu_dataloader.json.gz")])
    assert res.exit_code == 0, res.output
    assert "dataloader-bottleneck" in res.output
    failing = runner.invoke(report_cmd, [str(FIXTURES / "cpu_dataloader.json.gz"), "--fail-on",
                                         "critical"], standalone_mode=False)
    assert isinstance(failing.exception, FindingsThreshold)
    assert failing.exception.exit_code == ExitCode.FINDINGS
    healthy = runner.invoke(report_cmd, [str(FIXTURES / "cpu_healthy.json.gz"), "--fail-on", "warning"])
    assert healthy.exit_code == 0


def test_cli_writes_the_format_asked(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    res = CliRunner().invoke(report_cmd, [str(FIXTURES / "cpu_healthy.json.gz"), "--format", "json",
                                          "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["schema_version"] == SCHEMA_VERSION


def test_tensorboard_directory_layout(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    shutil.copy(TRACES / "gpu_sampled_rank0.json.gz", run / "host_1.pt.trace.json.gz")
    with gzip.open(TRACES / "gpu_sampled_rank1.json.gz") as src:
        (run / "host_2.pt.trace.json").write_bytes(src.read())
    (run / "notes.txt").write_text("ignored")
    report = analyze([str(tmp_path / "logs")])
    assert sorted(i.rank for i in report.inputs) == [0, 1]
    assert all(i.ok for i in report.inputs)


def test_a_directory_of_snapshots_and_censuses_gives_both_series() -> None:
    report = analyze([str(FIXTURES.parent / "agent")])
    assert sorted(s["kind"] for s in report.series) == ["census", "snapshot"]
    html = render_report(report, "html")
    assert "censuss" not in html and html.count("<svg") == 2


def test_cli_cannot_write_is_one_clear_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(report_cmd, [str(FIXTURES / "cpu_healthy.json.gz"), "-o",
                                          str(tmp_path / "missing" / "r.md")], standalone_mode=False)
    assert "cannot write" in str(res.exception)
    assert res.exception.exit_code == ExitCode.COMMAND_FAILED  # type: ignore[union-attr]


def test_html_renders_code_and_cpu_headings_and_whole_labels(tmp_path: Path) -> None:
    from report_synth import census, holder, write_json

    from flight_profiler.render.svg_charts import hbars
    from flight_profiler.report import analyze

    # GIVEN a CPU-only census pair with a leaking holder (its fix text carries `code`)
    paths = [str(write_json(tmp_path / f"c{n}.json",
                            census(3, 1.0 + n, [holder("main() local trainer.history[*]", k, 4 * k,
                                                       grad=k, graph=k * (2 << 20))])))
             for n, k in enumerate((10, 40, 80))]
    page = render_report(analyze(paths), "html")
    # THEN recommendations render code, not literal backticks
    assert "<code>loss.item()</code>" in page and "`" not in page
    # AND a CPU-only run has no "GPU memory" heading and no column of "?" totals
    assert "GPU Memory State" not in page and "Memory State (CPU)" in page
    assert "<th>total</th>" not in page and "<td>?</td>" not in page
    # AND a long operator name is drawn whole (wrapped), not cut with an ellipsis
    name = "aten::_scaled_dot_product_flash_attention_for_cpu_backward_" + "x" * 60
    svg = hbars([(name, 10.0, "10 ms")], "ops")
    text = "".join(re.findall(r'class="lb">([^<]*)</text>', svg))
    assert name in text and "…" not in svg
