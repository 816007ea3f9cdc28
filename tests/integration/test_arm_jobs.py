"""`arm`: triggers left in a real job that fire after the CLI is gone (docs/arm.md).

The jobs are written as users write them: the model and optimizer in main()'s locals, a data
queue fed by a worker thread; the hang is the producer dying after N batches, so the main thread
blocks in queue.get() forever; the NaN is a learning rate that blows up after N steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from arm_cli import CLI, ENV, cli, cli_json, events

from support import Target, spawn, temp_dir, torch_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch_available(), reason="needs torch in the test interpreter's venv"),
]


HANG_JOB = """
import queue, sys, threading, time
import torch

def producer(q, n):
    for i in range(n):
        q.put(torch.randn(16, 8))
        time.sleep(0.05)
    # the producer dies quietly: the consumer waits for ever

def main():
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    q = queue.Queue()
    go = sys.argv[1]
    print("READY", flush=True)
    import os
    while not os.path.exists(go):
        time.sleep(0.05)
    threading.Thread(target=producer, args=(q, 20), daemon=True).start()
    step = 0
    while True:
        x = q.get()                                   # HANG-LINE
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"step {step}", flush=True)

main()
"""

NAN_JOB = """
import os, sys, time
import torch
import torch.optim.optimizer as optimizer_module

def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    go = sys.argv[1]
    print("READY", flush=True)
    step = 0
    while True:
        x = torch.randn(32, 8)
        loss = (model(x) - 1).pow(2).mean()
        if step == int(os.environ.get("NAN_AT", "40")) and os.path.exists(go):
            loss = loss * float("inf")               # the loss blows up
        opt.zero_grad()
        loss.backward()
        opt.step()
        if os.path.exists(go):
            step += 1
        hooks = (len(optimizer_module._global_optimizer_pre_hooks),
                 len(optimizer_module._global_optimizer_post_hooks))
        print(f"step {step} hooks {hooks[0]} {hooks[1]}", flush=True)
        time.sleep(0.01)

main()
"""


# A regression on log-targets fed by a DataLoader; the files of a later shard hold zeros: from
# then on log(0) makes every loss infinite (the NaN the data keep making).
BAD_SHARD_JOB = """
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Shards(Dataset):
    def __init__(self, go):
        self.go = go
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        x = torch.randn(8)
        y = torch.rand(1) + 0.5
        if os.path.exists(self.go) and i % 64 == 0:
            y = torch.zeros(1)                      # the bad shard's empty targets
        return x, y

def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(Shards(sys.argv[1]), batch_size=64)
    print("READY", flush=True)
    step = 0
    for epoch in range(1000):
        for x, y in loader:
            pred = model(x)
            loss = torch.nn.functional.mse_loss(pred, torch.log(y))   # LOG-TARGET
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            modes = (torch._C._len_torch_dispatch_stack(), int(torch.is_anomaly_enabled()))
            print(f"step {step} loss {loss.item():.3f} modes {modes[0]} anomaly {modes[1]}", flush=True)
            time.sleep(0.01)

main()
"""


def located(event: Path, timeout: float = 20) -> dict[str, Any]:
    """event.json once the next step, watched op by op, has been added to it."""
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = json.loads((event / "event.json").read_text())
        if "located" in doc or time.monotonic() > deadline:
            return doc


def status_arm(pid: int) -> dict[str, Any]:
    arm: dict[str, Any] = cli_json(pid, "status").get("arm") or {}
    return arm


def start(code: str, env: dict[str, str] | None = None) -> tuple[Target, Path, Path]:
    go = temp_dir("fp-arm-go-") / "go"
    out = temp_dir("fp-arm-out-") / "evidence"
    return spawn(code, args=(str(go),), timeout=60, env=env), go, out


def test_hang_fires_after_the_cli_is_gone_and_names_the_line():
    target, go, out = start(HANG_JOB)
    try:
        proc = cli(target.pid, f"arm --on hang 3 --out {out}")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "armed in pid" in proc.stdout
        go.touch()  # the job starts its steps only now: the CLI has exited already
        target.wait_for(r"step 20\b", 60)
        (event,) = events(out, 30)
        doc = json.loads((event / "event.json").read_text())
        assert doc["trigger"] == "hang" and doc["step"] >= 20
        where = doc["where"]
        assert where["file"].endswith("target_main.py") and where["function"] == "main"
        line = Path(where["file"]).read_text().splitlines()[where["line"] - 1]
        assert "HANG-LINE" in line, line
        assert doc["stalled_s"] >= 3
        stacks = json.loads((event / "stacks.json").read_text())
        assert any(t.get("main") for t in stacks["threads"])
        assert "torch.distributed" in doc["fr"]  # said why there is no Flight Recorder dump
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert report.returncode == 0, report.stderr
        assert f"target_main.py:{where['line']}" in report.stdout, report.stdout
        assert "hang" in report.stdout.lower()
        assert target.alive()
    finally:
        target.stop()


def test_cli_killed_after_arm_the_nan_trigger_still_fires():
    target, go, out = start(NAN_JOB, env={"NAN_AT": "30"})
    try:
        target.wait_for(r"step 0", 60)
        # the CLI is SIGKILLed as soon as the agent answered: nothing it would do on exit runs
        popen = subprocess.Popen([*CLI, str(target.pid), "--cmd", f"arm --on nan --out {out}"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                                 start_new_session=True)
        assert popen.stdout is not None
        assert "armed in pid" in popen.stdout.readline()
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(10)
        go.touch()
        (event,) = events(out, 60)
        doc = json.loads((event / "event.json").read_text())
        assert doc["trigger"] == "nan"
        assert doc["step"] >= 30
        first = doc["first_params"]
        assert first and first[0]["name"] in {"0.weight", "0.bias", "2.weight", "2.bias"}, first
        assert first[0]["nonfinite_grad_elements"] > 0
        assert doc["clean_at_step"] is not None and doc["clean_at_step"] < doc["step"]
        # the loss blew up once: SGD applied the infinite gradient, the parameters are NaN, and
        # the next step, watched op by op, sees no op making a NaN out of finite values
        loc = located(event)["located"]
        assert loc["watched"] and not loc["found"], loc
        assert loc["first_nonfinite"]["nonfinite_input_is_parameter"] is True, loc
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert f"step {doc['step']}" in report.stdout, report.stdout
        assert first[0]["name"] in report.stdout
        assert "no op made a NaN or Inf out of finite values" in report.stdout, report.stdout
        # spent (max-fires 1): the watcher disarmed it, hooks and thread gone
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and status_arm(target.pid).get("armed"):
            time.sleep(0.2)
        arm = status_arm(target.pid)
        assert arm["armed"] == [] and arm["step_clock"] is None and not arm["watcher"]
        assert target.alive()
    finally:
        target.stop()


def test_nan_from_a_bad_data_shard_is_located_to_its_op_and_line():
    target, go, out = start(BAD_SHARD_JOB)
    try:
        target.wait_for(r"step 3 ", 60)
        armed = cli(target.pid, f"arm --on nan --out {out}")
        assert armed.returncode == 0, armed.stderr + armed.stdout
        go.touch()
        (event,) = events(out, 60)
        doc = located(event)
        loc = doc["located"]
        assert loc["watched"] and loc["found"] and loc["step"] == doc["step"] + 1, loc
        origin = loc["origin"]
        assert origin["op"].startswith("aten.log") and origin["inputs_finite"] is True, origin
        assert "LOG-TARGET" in origin["forward_stack"][-1], origin
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert report.returncode == 0 and "aten.log" in report.stdout, report.stdout
        assert "LOG-TARGET" in report.stdout and "clamp" in report.stdout, report.stdout
        # the job goes on (its loss is inf: that is the bug, not ours); nothing of ours is left
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and status_arm(target.pid).get("armed"):
            time.sleep(0.2)
        arm = status_arm(target.pid)
        assert arm["armed"] == [] and arm["step_clock"] is None and not arm["watcher"]
        # the watched step's dispatch mode and anomaly flags are gone: the job's own probe says so
        now = int(re.findall(r"step (\d+) ", target.stdout)[-1])
        target.wait_for(rf"step {now + 2} loss \S+ modes 0 anomaly 0", 30)
        assert target.alive()
    finally:
        target.stop()


def test_disarm_leaves_no_hooks_and_no_threads():
    target, _, out = start(NAN_JOB)
    try:
        target.wait_for(r"step 0", 60)
        before = cli_json(target.pid, "status")
        assert before["active_hooks"] == []
        for command in (f"arm --on nan --out {out}", f"arm --on hang 600 --out {out}",
                        f"arm --on oom --rss-limit 64G --out {out}"):
            cli_json(target.pid, command)
        armed = cli_json(target.pid, "status")
        assert [t["kind"] for t in armed["arm"]["armed"]] == ["nan", "hang", "oom"]
        assert any(h.startswith("arm:") for h in armed["active_hooks"])
        assert armed["threads"]["agent"] == before["threads"]["agent"] + 1  # the watcher
        mark = len(target.stdout)
        target.wait_for(r"step \d+ hooks 0 1", 30, start=mark)  # the step clock's one post-step hook
        result = cli_json(target.pid, "disarm")
        assert len(result["disarmed"]) == 3
        assert all(not t["left_behind"] for t in result["disarmed"]), result
        after = cli_json(target.pid, "status")
        assert after["active_hooks"] == []
        assert after["arm"]["armed"] == [] and after["arm"]["step_clock"] is None
        assert not after["arm"]["watcher"]
        assert after["threads"]["agent"] == before["threads"]["agent"]
        mark = len(target.stdout)
        target.wait_for(r"step \d+ hooks 0 0\n.*step \d+ hooks 0 0", 30, start=mark)
        assert not re.search(r" hooks (\d+ [1-9]|[1-9]\d* \d+)", target.stdout[mark:])
        assert target.alive()
    finally:
        target.stop()


OOM_JOB = """
import os, sys, time
import torch

def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    go = sys.argv[1]
    print("READY", flush=True)
    while not os.path.exists(go):
        time.sleep(0.05)
    predictions = []                                  # kept for an end-of-epoch metric
    step = 0
    while True:
        x = torch.randn(2048, 256)
        hidden = model[1](model[0](x))                # STEP: an 8 MiB activation each step
        loss = model[2](hidden).pow(2).mean()         # STEP
        opt.zero_grad()
        loss.backward()                               # STEP
        opt.step()
        predictions.append(hidden[:512].detach().clone())  # the leak: 2 MiB a step, never freed
        step += 1
        print(f"step {step}", flush=True)
        time.sleep(0.02)

main()
"""


def _statm(pid: int) -> tuple[int, int]:
    """(virtual size, RSS) of ``pid`` in bytes."""
    size, rss = Path(f"/proc/{pid}/statm").read_text().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(rss) * page


def test_a_real_cpu_oom_under_rlimit_as_fires_with_the_line_and_who_holds_the_memory():
    """The job keeps 2 MiB a step until torch's CPU allocator fails under RLIMIT_AS (a
    RuntimeError "DefaultCPUAllocator: can't allocate memory", not a MemoryError) and kills it;
    on the way its RSS passes --rss-limit. Two events: the RSS crossing with a census, and the
    uncaught out-of-memory error with its line and a census taken while its frames still hold
    the memory; the report names both. The failing allocation is an 8 MiB activation: what a
    census needs is left once it fails (with 2 MiB ones the census itself ran out of memory
    under load, and says so: "census skipped: out of memory while taking it")."""
    import resource

    target, go, out = start(OOM_JOB)
    try:
        target.wait_for("READY", 60)
        _, rss = _statm(target.pid)
        proc = cli(target.pid, f"arm --on oom --rss-limit {(rss >> 20) + 120}M --max-fires 2 --out {out}")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        # the limit is set once the agent is in (its thread and arena count too): 400 MiB more
        size, _ = _statm(target.pid)
        resource.prlimit(target.pid, resource.RLIMIT_AS, (size + (400 << 20), resource.RLIM_INFINITY))
        go.touch()
        target.popen.wait(120)
        assert target.popen.returncode not in (0, None)
        assert "DefaultCPUAllocator" in target.stderr  # the job's own traceback still printed
        found = events(out, 10)
        docs = [json.loads((e / "event.json").read_text()) for e in found]
        assert [d["signal"] for d in docs] == ["rss", "exception"], docs
        rss_doc, exc_doc = docs
        assert rss_doc["rss_bytes"] > rss_doc["rss_limit"]
        assert "DefaultCPUAllocator: can't allocate memory" in exc_doc["error"]
        where = exc_doc["where"]
        assert where["file"].endswith("target_main.py") and where["function"] == "main"
        line = Path(where["file"]).read_text().splitlines()[where["line"] - 1]
        assert "# STEP" in line, line
        # the kept predictions are the biggest holder, found by name, and grew in between
        assert all(doc.get("census_top") for doc in docs), [(d["signal"], d.get("census"), d.get("capture_error")) for d in docs]
        tops = [doc["census_top"][0] for doc in docs]
        assert all("predictions" in top["path"] for top in tops), tops
        assert tops[0]["bytes"] >= 16 << 20 and tops[1]["bytes"] >= 200 << 20, tops
        assert (found[1] / "census.json").is_file() and (found[1] / "stacks.json").is_file()
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert report.returncode == 0, report.stderr
        text = report.stdout
        assert "DefaultCPUAllocator" in text and f"target_main.py:{where['line']}" in text, text
        assert "passed the limit" in text and "predictions" in text, text
    finally:
        target.stop()


def test_torchrun_rank_stuck_in_its_data_path_both_ranks_fire_and_the_report_names_it(tmp_path: Path):
    """Two gloo ranks, `arm --on hang 4` on each; rank 1 stops in its data path, rank 0 then
    waits in DDP's all-reduce. Each rank's trigger fires (long before the group's 10-minute
    timeout) and names its own line; both ranks are alive afterwards."""
    from torchrun_jobs import WORKLOADS, Job

    go = tmp_path / "go"
    out = tmp_path / "evidence"
    job = Job(WORKLOADS / "ddp_data_hang.py", "train", 2, tmp_path,
              env={"HANG_GO": str(go), "TORCH_FR_BUFFER_SIZE": "2000"})
    try:
        pids = job.wait_ready()
        for _rank, pid in sorted(pids.items()):
            proc = cli(pid, f"arm --on hang 4 --out {out}")
            assert proc.returncode == 0, proc.stderr + proc.stdout
        go.touch()
        deadline = time.monotonic() + 90
        found: list[Path] = []
        while time.monotonic() < deadline and len(found) < 2:
            found = sorted(p for p in out.iterdir() if not p.name.startswith("."))
            time.sleep(0.5)
        docs = {json.loads((e / "event.json").read_text())["rank"]["rank"]:
                json.loads((e / "event.json").read_text()) for e in found}
        assert sorted(docs) == [0, 1], found
        script = (WORKLOADS / "ddp_data_hang.py").read_text().splitlines()
        for rank, marker in ((0, "COLLECTIVE"), (1, "DATA-HANG")):
            doc = docs[rank]
            assert doc["trigger"] == "hang" and doc["stalled_s"] >= 4
            where = doc["where"]
            assert where["file"].endswith("ddp_data_hang.py"), where
            assert marker in script[where["line"] - 1], (rank, where)
        assert job.dead_ranks() == [] and job.popen.poll() is None, job.log_tail()
        report = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True,
                                timeout=120, env=ENV)
        assert report.returncode == 0, report.stderr
        text = report.stdout
        lines = {rank: f"ddp_data_hang.py:{docs[rank]['where']['line']}" for rank in docs}
        assert lines[0] in text and lines[1] in text, text
        # the cause is the rank outside any collective, named first; rank 0 waits for it
        assert text.splitlines()[0].startswith("Verdict") and "rank 1" in text.splitlines()[0], text
        assert "Rank 1 stopped outside any collective" in text, text
        assert "Rank 0 waits in a collective" in text, text
    finally:
        job.stop()
