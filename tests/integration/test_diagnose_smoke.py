"""Smoke test of `flight_profiler diagnose` against the bundled sample workloads (real processes,
real agent, real report engine).

Each planted problem must be the TOP finding; the healthy workload must have no finding of
warning or above; every artefact must load (traces as JSON, snapshot pickles with pickle, the
census and report JSON). transfer_sync's problem exists only with a GPU: on a CPU-only machine it
must stay as clean as the healthy one. The same test runs unchanged on a CUDA machine (the
workloads then use the GPU and the snapshot/record phases run).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flight_profiler.diagnose.launch import start_workload
from flight_profiler.workloads import WORKLOADS
from support import torch_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_available(), reason="the sample workloads need torch"),
]

SEVERE = ("warning", "critical")
CLI = [sys.executable, "-m", "flight_profiler"]


def diagnose(tmp_path: Path, name: str) -> tuple[dict[str, Any], Path, Any]:
    job = start_workload(name, str(tmp_path / "workload.log"))
    out = tmp_path / "diag"
    try:
        target = job.wait_ready(90)
        proc = subprocess.run(
            [*CLI, "diagnose", str(job.pid), *target.words.split(), "--out", str(out),
             "--calls", "5", "--duration", "3", "--timeout", "30", "--json"],
            capture_output=True, text=True, timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # the job survived its diagnosis and is still training
        assert job.popen.poll() is None, job.output()[-2000:]
        beats = len(job.heartbeats())
    finally:
        log_tail = job.output()[-3000:]
        job.stop()
    result = json.loads(proc.stdout)
    result["_log_tail"], result["_beats"] = log_tail, beats
    return result, out, target


def check_artefacts(result: dict[str, Any], out: Path) -> None:
    files = [Path(f) for f in result["artefacts"]]
    assert files, "no artefact written"
    for f in files:
        assert f.is_file() and f.stat().st_size > 0, f
        if f.name.endswith(".json.gz"):
            with gzip.open(f, "rt") as fh:
                trace = json.load(fh)
            assert trace["traceEvents"], f
        elif f.suffix == ".pickle":
            with open(f, "rb") as fh:
                snap = pickle.load(fh)
            assert isinstance(snap, (dict, list)), f
        elif f.name.startswith("census-"):
            assert json.loads(f.read_text())["format"] == "flight_profiler.census", f
    report = json.loads((out / "report.json").read_text())
    assert report["schema_version"] >= 1 and report["diagnose"]["phases"]
    assert json.loads((out / "diagnose.json").read_text())["format"] == "flight_profiler.diagnose"
    assert (out / "report.md").read_text().startswith("#")
    assert "<html" in (out / "report.html").read_text().lower()
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def severe(result: dict[str, Any]) -> list[str]:
    return [f"{f['severity']} {f['rule']}: {f['title']} {f.get('metrics')}"
            for f in result["findings"] if f["severity"] in SEVERE]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_diagnose_names_the_planted_problem(tmp_path: Path, name: str) -> None:
    result, out, _ = diagnose(tmp_path, name)
    check_artefacts(result, out)
    phases = {p["name"]: p for p in result["phases"]}
    assert phases["profile"]["status"] == "ok", phases["profile"]
    assert phases["census-after"]["status"] == "ok", phases["census-after"]
    assert phases["watch"]["data"]["cost"]["calls"] >= 1
    assert phases["trace"]["data"]["where_time_goes"]["top"], phases["trace"]
    cuda = phases["status"]["data"]["cuda"]
    # CUDA: the allocator's snapshots and history; CPU: the agent's CPU snapshots, and no
    # recording (the profile's memory events are the same calls' allocations).
    for name_ in ("snapshot-before", "snapshot-after"):
        assert phases[name_]["status"] == "ok", phases[name_]
    assert phases["record"]["status"] == ("ok" if cuda else "skipped"), phases["record"]
    expected, _ = WORKLOADS[name]
    if name == "transfer_sync" and not cuda:
        expected = None  # nothing to transfer to or wait for on a CPU-only machine
    if expected is None:
        assert severe(result) == [], severe(result)
    else:
        assert result["findings"], f"no finding for {name}"
        top = result["findings"][0]
        assert top["rule"] == expected, (
            [f"{f['severity']} {f['rule']}: {f['title']}" for f in result["findings"]],
            {n: (p["status"], p["seconds"], p["data"].get("totals"), p["data"].get("seconds_since_before"))
             for n, p in phases.items() if n.startswith(("census", "profile"))})
        assert top["severity"] in SEVERE


def test_demo_runs_diagnoses_and_stops_its_workload(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [*CLI, "demo", "--workload", "dataloader_bound", "--out", str(out), "--calls", "3",
         "--duration", "1"],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the planted problem is dataloader-bottleneck: found it" in proc.stdout, proc.stdout
    pid = int(proc.stdout.split("workload running as pid ")[1].split(";")[0])
    assert not os.path.exists(f"/proc/{pid}"), "the demo left its workload running"
    assert (out / "report.html").is_file() and (out / "workload.log").is_file()
