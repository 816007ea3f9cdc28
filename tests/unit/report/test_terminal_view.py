"""The terminal view at 80 columns: verdict first, names shortened, paths whole (issue 12)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from rich.console import Console

from flight_profiler.render.report_summary import short_name
from flight_profiler.render.report_terminal import print_report
from flight_profiler.report import analyze
from support import TRACES


def _render(paths: list[str], width: int = 80) -> list[str]:
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False)
    print_report(analyze(paths), console=con)
    return [ln.rstrip() for ln in buf.getvalue().splitlines()]


def test_verdict_first_and_nothing_wider_than_80_columns_but_paths(tmp_path: Path) -> None:
    # GIVEN two ranks of a real job copied under a long directory name
    deep = tmp_path / ("a-rather-long-experiment-directory-name-" * 3)
    deep.mkdir()
    paths = []
    for n in ("gpu_train_test.json.gz", "gpu_train_control.json.gz"):
        shutil.copy(TRACES / n, deep / n)
        paths.append(str(deep / n))
    lines = _render(paths)
    # THEN the first line is the verdict naming the costliest problem and its cost
    assert lines[0].startswith("Verdict, fix first: ")
    assert "%" in lines[0] or "%" in lines[1]
    # every artefact path is printed whole on one line (copyable), the only lines over 80 columns
    for p in paths:
        assert any(ln.strip() == p for ln in lines), p
    wide = [ln for ln in lines if len(ln) > 80]
    assert all(ln.strip() in paths for ln in wide), wide
    # long kernel names are shortened: no argument lists of templated kernels
    assert not any("(ncclWorkElem)" in ln or "ncclDevComm*" in ln for ln in lines)
    # a trace's file name heads its block once instead of starting every row
    name = "gpu_train_test.json.gz"
    rows_starting_with_name = [ln for ln in lines if ln.startswith(name)]
    assert len(rows_starting_with_name) == 1


def test_the_gpu_bound_sync_is_not_the_verdict() -> None:
    lines = _render([str(TRACES / "gpu_train_test.json.gz")])
    assert "sync" not in lines[0].lower()
    text = "\n".join(lines)
    assert "The CPU waits for a busy GPU" in text


def test_short_name_folds_templates_and_drops_arguments() -> None:
    name = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, "
            "128, 1>(at::native::(anonymous namespace)::CatArrInputTensorMetadata<float>)")
    s = short_name(name, 40)
    assert len(s) <= 40 and s.startswith("at::native::CatArrayBatchedCopy<...>")
    assert short_name("aten::mm", 40) == "aten::mm"
