"""The report is light: no torch, rich only for the terminal view, bounded memory, Python 3.9+."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import PYTHONS

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "traces"


def _run(python: str, code: str) -> dict:  # type: ignore[type-arg]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_analyze_and_file_outputs_import_neither_torch_nor_rich() -> None:
    got = _run(sys.executable, f"""
import json, sys
from flight_profiler.render.formats import render_report
from flight_profiler.report import analyze
r = analyze([{str(FIXTURES / 'cpu_leak.json.gz')!r}])
render_report(r, "md"); render_report(r, "html"); r.to_json()
print(json.dumps({{"torch": "torch" in sys.modules, "rich": "rich" in sys.modules,
                   "rules": sorted({{f.rule for f in r.findings}})}}))
""")
    assert got == {"torch": False, "rich": False, "rules": ["hot-operators", "memory-leak"]}


@pytest.mark.skipif("3.9" not in PYTHONS, reason="no CPython 3.9 here")
def test_analyze_runs_on_python_39() -> None:
    got = _run(PYTHONS["3.9"], f"""
import json
from flight_profiler.report import analyze
r = analyze([{str(FIXTURES / 'cpu_dataloader.json.gz')!r}])
print(json.dumps(sorted({{f.rule for f in r.findings}})))
""")
    assert got == ["dataloader-bottleneck", "hot-operators"]


@pytest.mark.slow
def test_memory_stays_bounded_while_streaming(tmp_path: Path) -> None:
    # A 300 k-event trace is ~60 MB of JSON; json.load needs ~5x that. Streaming must not.
    sys.path.insert(0, str(REPO / "bench"))
    from gen_trace import generate

    path = tmp_path / "big.json.gz"
    generate(str(path), 300_000)
    got = _run(sys.executable, f"""
import json, resource
from flight_profiler.report import analyze
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = analyze([{str(path)!r}])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"grew_mb": (peak - base) / 1024, "ok": r.inputs[0].ok,
                   "events": r.inputs[0].data["events"]}}))
""")
    assert got["ok"] and got["events"] >= 300_000
    assert got["grew_mb"] < 80, got
