"""report --diff BEFORE AFTER: verdicts on real traces (GPU fixtures, CPU traces made here),
censuses, and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flight_profiler.report.diff import DiffError, compare
from flight_profiler.report.loaders import load_one

REPO = Path(__file__).resolve().parents[3]
TRACES = REPO.parent / "shared" / "fixtures" / "traces"
CONTROL, TEST = TRACES / "gpu_train_control.json.gz", TRACES / "gpu_train_test.json.gz"


@pytest.mark.skipif(not CONTROL.exists(), reason="shared GPU fixtures not present")
def test_gpu_traces_verdict_names_step_time_and_the_operators_behind_it():
    d = compare(str(CONTROL), str(TEST))
    b, a = load_one(str(CONTROL)).data["steps"]["median_us"], load_one(str(TEST)).data["steps"]["median_us"]
    expected = round(100 * (a - b) / b)
    assert d.verdict.startswith(f"step time {expected:+d}%: ")
    ops = {c.what: c for c in d.sections["operators (self time)"]}
    assert ops["aten::_local_scalar_dense"].after > 4 * ops["aten::_local_scalar_dense"].before
    assert "aten::_local_scalar_dense" in d.verdict
    reverse = compare(str(TEST), str(CONTROL))
    assert reverse.verdict.startswith("step time -")


def _cpu_trace(path: Path, extra_matmul: bool) -> str:
    torch = pytest.importorskip("torch")
    # Big enough that a step is milliseconds: preemption on a loaded machine stays noise.
    a = torch.randn(512, 512)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(7):
            # The annotation prof.step() writes under a schedule: the report's step boundaries.
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                x = torch.relu(a @ a)
                if extra_matmul:
                    for _ in range(6):
                        x = x @ a
    prof.export_chrome_trace(str(path))
    return str(path)


def test_cpu_fix_shows_as_faster_steps_driven_by_mm(tmp_path):
    slow = _cpu_trace(tmp_path / "before.json", True)
    fast = _cpu_trace(tmp_path / "after.json", False)
    d = compare(slow, fast)
    assert d.headline is not None and d.headline.what == "step time"
    assert d.headline.delta_pct is not None and d.headline.delta_pct < -30, d.verdict
    assert "aten::mm" in d.verdict or "aten::matmul" in d.verdict, d.verdict


def _census(path: Path, holders: list[tuple[str, int, int]]) -> str:
    doc = {"format": "flight_profiler.census", "version": 1, "pid": 1, "time": 0.0, "label": "",
           "totals": {"count": len(holders), "bytes": sum(h[1] for h in holders), "with_grad_fn": 0,
                      "graph_bytes": sum(h[2] for h in holders), "by_device": {}},
           "holders": [{"path": p, "example": p, "kind": "list", "count": 1, "bytes": b, "with_grad_fn": 0,
                        "graph_bytes": g} for p, b, g in holders], "groups": [], "sites": []}
    path.write_text(json.dumps(doc))
    return str(path)


def test_census_diff_names_the_holder_that_shrank(tmp_path):
    before = _census(tmp_path / "c1.json", [("__main__.history[*]", 100 << 20, 50 << 20), ("__main__.model", 10 << 20, 0)])
    after = _census(tmp_path / "c2.json", [("__main__.model", 10 << 20, 0)])
    d = compare(before, after)
    assert d.verdict.startswith("live tensor memory -94%") and "__main__.history[*] gone" in d.verdict


def test_mixed_kinds_and_wrong_counts_are_clear_errors(tmp_path):
    census = _census(tmp_path / "c.json", [("x", 1, 0)])
    with pytest.raises(DiffError, match="cannot compare a census with a trace"):
        compare(census, str(CONTROL))
    cli = [sys.executable, "-m", "flight_profiler", "report", "--diff"]
    three = subprocess.run([*cli, census, census, census], capture_output=True, text=True, timeout=60)
    assert three.returncode == 2 and "exactly two inputs" in three.stderr
    mixed = subprocess.run([*cli, census, str(CONTROL)], capture_output=True, text=True, timeout=60)
    assert mixed.returncode == 8 and "cannot compare" in mixed.stderr
    ok = subprocess.run([*cli, census, census, "--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["verdict"].startswith("live tensor memory unchanged")


def test_snapshot_diff_says_what_memory_changed(tmp_path):
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from torch_agent_helpers import run_handler

    keep = [torch.zeros(1 << 20)]  # 4 MiB
    run_handler("torch memory", {"mode": "snapshot", "path": str(tmp_path / "s1.pickle")})
    keep.append(torch.zeros(4 << 20))  # + 16 MiB
    run_handler("torch memory", {"mode": "snapshot", "path": str(tmp_path / "s2.pickle")})
    d = compare(str(tmp_path / "s1.pickle"), str(tmp_path / "s2.pickle"))
    assert d.kind == "snapshot" and d.headline is not None
    assert d.headline.after - d.headline.before >= 16 << 20  # type: ignore[operator]
    assert d.verdict.startswith("allocated +")
    del keep
