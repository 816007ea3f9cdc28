"""`arm --on slow FACTOR`: a real training job that becomes slower after N steps (docs/arm.md).

The job is written as users write them: the model and optimizer in main()'s locals, the batches
from a generator that reads a "shard"; after a while the shard is slower to read and its batches
bigger (4x the read time, 4x the rows), so the steps are ~4x as long. The steps are 0.1 s, not
a few ms: on the shared 2-core test machine (load ~10) a 20 ms step took 32 ms at the median,
56 ms at p90 and up to 144 ms; a delay that is added, not multiplied, is small against 0.1 s. The trigger must fire at
the slowdown, not before, profile the slow steps that follow, and `report DIR` must name it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from arm_cli import CLI, ENV, cli, cli_json, events

from support import Target, spawn, temp_dir, torch_available
from torchrun_jobs import DDP_TRAINER
from torchrun_jobs import Job as DdpJob

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch_available(), reason="needs torch in the test interpreter's venv"),
]


SLOW_JOB = """
import os, sys, time
import torch

def batches(go, slow_after):
    step = 0
    while True:
        slow = step >= slow_after
        if slow and step == slow_after:
            print(f"SLOW-FROM {time.time():.6f}", flush=True)
        time.sleep(0.4 if slow else 0.1)           # the new shard: reads take 4x as long
        rows = 256 if slow else 64                  # ... and its batches are 4x bigger
        yield torch.randn(rows, 32), torch.randn(rows, 1)
        if os.path.exists(go):
            step += 1

def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a shared 2-core box: two OpenMP threads made tiny steps 1-200 ms
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    print("READY", flush=True)
    for step, (x, y) in enumerate(batches(sys.argv[1], int(sys.argv[2]))):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}", flush=True)

main()
"""



def start(slow_after: int) -> tuple[Target, Path, Path]:
    go = temp_dir("fp-slow-go-") / "go"
    out = temp_dir("fp-slow-out-") / "evidence"
    return spawn(SLOW_JOB, args=(str(go), str(slow_after)), timeout=180), go, out


def test_slow_fires_at_the_slowdown_profiles_the_slow_steps_and_report_names_it():
    # 60 steady steps after `go` (a warm-up of 20 and a median of 40 more), then 4x slower
    target, go, out = start(slow_after=60)
    try:
        target.wait_for(r"step 0\b", 60)
        proc = cli(target.pid, f"arm --on slow 2.5 --steps 3 --out {out}")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "slow [armed] (factor=2.5, steps=3)" in proc.stdout, proc.stdout
        go.touch()
        (event,) = events(out, 120)
        doc = json.loads((event / "event.json").read_text())
        slow_from = float(target.wait_for(r"SLOW-FROM (\S+)", 5).group(1))
        assert doc["trigger"] == "slow" and doc["factor"] == 2.5 and doc["steps_wanted"] == 3
        # it fired on a step of the slow shard, not on a hiccup before it
        seen = {k: doc.get(k) for k in ("step", "slow_step", "slow_step_end", "slow_run_s",
                                        "median_s", "profiled_step_s", "window_steps")}
        assert doc["slow_step_end"] >= slow_from, (seen, slow_from)
        assert len(doc["slow_run_s"]) == 2 and min(doc["slow_run_s"]) > 2.5 * doc["median_s"], seen
        assert doc["slow_step_s"] > 2.5 * doc["median_s"]
        assert doc["median_s"] < 0.5 * doc["slow_step_s"]
        assert doc["timed_out"] is False
        profiled = doc["profiled_step_s"]
        assert len(profiled) == 3, seen
        assert sorted(profiled)[1] > 2 * doc["median_s"], seen  # the slow regime, profiled
        # the trace holds the steps after the slow one: 4 step ends (3 whole steps) and the
        # slow shard's 256-row batches in its matmuls
        assert doc["files"].get("slow_steps.pt.trace.json", 0) > 0
        trace_path = event / "slow_steps.pt.trace.json"
        assert (trace_path.stat().st_mode & 0o777) == 0o600
        trace = json.loads(trace_path.read_text())
        names = [e.get("name", "") for e in trace["traceEvents"]]
        marks = [n for n in names if n.startswith("flight_profiler.optimizer_step#0 Adam")]
        assert len(marks) >= 4, len(marks)
        dims = [e.get("args", {}).get("Input Dims") for e in trace["traceEvents"]
                if e.get("name") == "aten::addmm"]
        assert any(d and [256, 32] in d for d in dims), dims[:5]
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert report.returncode == 0, report.stderr
        assert "arm-slow" in report.stdout, report.stdout
        assert f"step {doc['slow_step']} took" in report.stdout, report.stdout
        assert "slow_steps.pt.trace.json" in report.stdout
        assert "3 steps of" in report.stdout, report.stdout  # the trace read as 3 whole steps
        # spent (max-fires 1): disarmed by the watcher, the step clock's hooks gone
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cli_json(target.pid, "status")["arm"]["armed"]:
            time.sleep(0.2)
        status = cli_json(target.pid, "status")
        assert status["arm"]["armed"] == [] and status["arm"]["step_clock"] is None
        assert status["active_hooks"] == []
        assert target.alive()
        assert target.stderr == "", target.stderr
    finally:
        target.stop()


def test_steady_job_does_not_fire_and_disarm_during_warmup_leaves_nothing():
    target, go, out = start(slow_after=10**9)
    try:
        target.wait_for(r"step 0\b", 60)
        before = cli_json(target.pid, "status")
        cli_json(target.pid, f"arm --on slow 5 --out {out}")  # a loaded box: 2 steps over 5x is no noise
        go.touch()
        mark = len(target.stdout)
        target.wait_for(r"step \d+\n(.*\n){60}", 120, start=mark)
        status = cli_json(target.pid, "status")
        (armed,) = status["arm"]["armed"]
        assert armed["kind"] == "slow" and armed["fires"] == 0, armed
        assert armed["steps_timed"] >= 40 and armed["median_step_s"] > 0.015, armed
        found = events(out, 0.5)
        assert found == [], (found[0] / "event.json").read_text()
        result = cli_json(target.pid, "disarm")
        assert [t["kind"] for t in result["disarmed"]] == ["slow"]
        assert all(not t["left_behind"] for t in result["disarmed"]), result
        after = cli_json(target.pid, "status")
        assert after["active_hooks"] == [] and after["arm"]["step_clock"] is None
        # the thread that imported torch._inductor at arm time (see slow.py) ends by itself
        deadline = time.monotonic() + 60
        while after["threads"]["agent"] != before["threads"]["agent"] and time.monotonic() < deadline:
            time.sleep(0.5)
            after = cli_json(target.pid, "status")
        assert after["threads"]["agent"] == before["threads"]["agent"]
        assert target.alive() and target.stderr == ""
    finally:
        target.stop()


def test_bad_slow_arguments_are_one_line_and_exit_2():
    target, _, out = start(slow_after=10**9)
    try:
        target.wait_for(r"step 0\b", 60)
        for command, cause in ((f"arm --on slow --out {out}", "needs FACTOR"),
                               (f"arm --on slow 1 --out {out}", "not a FACTOR above 1"),
                               (f"arm --on slow 3y --out {out}", "not a FACTOR above 1"),
                               (f"arm --on hang 60 --steps 3 --out {out}", "go with --on slow"),
                               (f"arm --on slow 3 --steps 0 --out {out}", "--steps")):
            proc = cli(target.pid, command)
            assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
            assert cause in proc.stderr and "\n" not in proc.stderr.split("hint:")[0].strip(), proc.stderr
        assert (cli_json(target.pid, "status").get("arm") or {}).get("armed") in (None, [])
    finally:
        target.stop()


def test_diagnose_arm_leaves_triggers_whose_evidence_goes_under_its_out_dir():
    target, go, _ = start(slow_after=60)
    out = temp_dir("fp-slow-diag-") / "diag"
    try:
        target.wait_for(r"step 0\b", 60)
        # a typo in --arm: one line, exit 2, the target untouched and no directory made
        bad = subprocess.run([*CLI, "diagnose", str(target.pid), "--out", str(out), "--arm",
                              "hang 600,slow 1"], capture_output=True, text=True, timeout=60, env=ENV)
        assert bad.returncode == 2 and "'slow 1'" in bad.stderr, bad.stderr
        assert not out.exists()
        assert "flight_profiler" not in Path(f"/proc/{target.pid}/maps").read_text()
        proc = subprocess.run([*CLI, "diagnose", str(target.pid), "--duration", "2", "--out",
                               str(out), "--json", "--arm", "hang 10m, slow 2.5 --steps 2"],
                              capture_output=True, text=True, timeout=280, env=ENV)
        doc = json.loads(proc.stdout.splitlines()[-1])
        assert proc.returncode == doc["exit_code"] == 0, proc.stderr[-2000:]
        armed = doc["armed"]
        assert [(a["kind"], a["armed"]) for a in armed] == [("hang", True), ("slow", True)], armed
        assert all(a["out"] == str(out / "armed") for a in armed)
        # the agent stayed (detach would have disarmed): the triggers watch on
        status = cli_json(target.pid, "status")
        assert [t["kind"] for t in status["arm"]["armed"]] == ["hang", "slow"]
        go.touch()
        (event,) = events(out / "armed", 120)
        ev = json.loads((event / "event.json").read_text())
        assert ev["trigger"] == "slow" and ev["params"] == {"factor": 2.5, "steps": 2}
        assert len(ev["profiled_step_s"]) == 2
        report = subprocess.run([*CLI, "report", str(out / "armed")], capture_output=True,
                                text=True, timeout=120, env=ENV)
        assert "arm-slow" in report.stdout, report.stdout
        assert cli_json(target.pid, "disarm")["still_armed"]["armed"] == []
        assert target.alive() and target.stderr == ""
    finally:
        target.stop()


def test_all_ranks_arm_each_rank_catches_its_own_hang(tmp_path: Path) -> None:
    # the DDP trainer (tests/integration/job_workloads): rank 1's prefetch thread dies once the
    # test says so (after arming), so rank 1 waits for a batch for ever and rank 0 in backward's gradient
    # all-reduce. `--all-ranks --cmd "arm ..."` arms each rank before that; each catches its own.
    bad_sample = tmp_path / "bad-sample"
    job = DdpJob(DDP_TRAINER, "hang", 2, tmp_path,
                 {"TORCH_FR_BUFFER_SIZE": "2000", "FP_HANG_FILE": str(bad_sample)})
    out = temp_dir("fp-slow-ranks-") / "evidence"
    try:
        pids = job.wait_ready()
        proc = subprocess.run([*CLI, str(job.launcher), "--all-ranks", "--json", "--cmd",
                               f"arm --on hang 5 --out {out}"], capture_output=True, text=True,
                              timeout=240, env=ENV)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        doc = json.loads(proc.stdout.splitlines()[-1])
        assert sorted(doc["ranks"]) == ["0", "1"] and doc["failed"] == [], doc
        time.sleep(1.0)  # a few steps armed
        bad_sample.touch()
        deadline = time.monotonic() + 180
        found: list[Path] = []
        while time.monotonic() < deadline and len(found) < 2:
            found = events(out, 1)
            time.sleep(0.5)
        assert len(found) == 2, found
        by_rank = {}
        for event in found:
            ev = json.loads((event / "event.json").read_text())
            assert ev["trigger"] == "hang" and ev["pid"] == pids[ev["rank"]["rank"]]
            assert f"-rank{ev['rank']['rank']}-" in event.name
            assert ev["step"] > 0  # armed while the job still stepped: the hang came after
            assert "fr_trace.pickle" in ev["files"], ev.get("fr")  # Flight Recorder, per rank
            by_rank[ev["rank"]["rank"]] = ev
        assert sorted(by_rank) == [0, 1]
        print(f"rank events {abs(by_rank[0]['time'] - by_rank[1]['time']):.2f} s apart; steps "
              f"{by_rank[0]['step']} and {by_rank[1]['step']} after arming")
        # each rank's own line: rank 1 waits for its batch, rank 0 in the all-reduce of backward
        assert by_rank[1]["where"]["function"].endswith("wait_for_batch"), by_rank[1]["where"]
        assert by_rank[0]["where"]["file"].endswith("ddp_trainer.py")
        assert by_rank[0]["where"]["function"] != by_rank[1]["where"]["function"]
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert report.stdout.count("arm-hang") >= 2, report.stdout
        assert "rank 0" in report.stdout and "rank 1" in report.stdout
        assert not job.dead_ranks()  # caught, not killed
    finally:
        job.stop()


def test_diagnose_all_ranks_arm_arms_every_rank_and_disarm_leaves_none(tmp_path: Path) -> None:
    # `diagnose --all-ranks --arm`: the job pass, then the same triggers in every rank, whose
    # agents stay (detach would disarm); evidence under OUT/armed. The old code refused it.
    job = DdpJob(DDP_TRAINER, "healthy", 2, tmp_path)
    out = temp_dir("fp-diag-ranks-arm-") / "diag"
    try:
        pids = job.wait_ready()
        proc = subprocess.run([*CLI, "diagnose", str(job.launcher), "--all-ranks", "--duration", "2",
                               "--out", str(out), "--json", "--arm", "hang 600,nan"],
                              capture_output=True, text=True, timeout=280, env=ENV)
        doc = json.loads(proc.stdout.splitlines()[-1])
        assert proc.returncode == doc["exit_code"], proc.stderr[-2000:]
        assert doc["exit_code"] in (0, 9), proc.stderr[-2000:]  # armed: nothing failed
        armed = {r["rank"]: r for r in doc["armed"]}
        assert sorted(armed) == [0, 1], doc["armed"]
        for rank, r in armed.items():
            assert r["ok"] and r["pid"] == pids[rank], r
            assert [(a["kind"], a["armed"]) for a in r["result"]["armed"]] == [("hang", True), ("nan", True)]
            assert all(a["out"] == str(out / "armed") for a in r["result"]["armed"])
        for rank, pid in pids.items():  # both agents stayed, both ranks armed and stepping
            status = cli_json(pid, "status")
            assert sorted(t["kind"] for t in status["arm"]["armed"]) == ["hang", "nan"], (rank, status)
        for pid in pids.values():
            assert cli_json(pid, "disarm")["still_armed"]["armed"] == []
            assert cli_json(pid, "status")["arm"]["armed"] == []
        assert not job.dead_ranks()
    finally:
        job.stop()
