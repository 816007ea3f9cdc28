"""torch memory / tensors / profile against a real CPU training process, through the CLI.

One target serves the whole module (attaching is the expensive part): a small model trained in
the main thread with the classic leak (losses.append(loss)), plus a worker thread running
torch ops (joined at exit). After every command the target must still make progress; at the
end it must exit by itself with code 0, with nothing of ours in its stdout/stderr.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import Target, spawn, temp_dir, torch_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not torch_available(), reason="needs torch in the test interpreter's venv"),
]

CLI = [sys.executable, "-m", "flight_profiler"]

TRAINER = """
import os, sys, threading, time
import torch

stop_file = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []

def train_step(i):
    x = torch.randn(32, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
    return loss.item()

done = threading.Event()

def worker():
    lin = torch.nn.Linear(32, 32)
    while not done.is_set():
        with torch.no_grad():
            lin(torch.randn(8, 32))
        time.sleep(0.005)

w = threading.Thread(target=worker, name="side-worker")
w.start()
print("READY", flush=True)
i = 0
while not os.path.exists(stop_file):
    value = train_step(i)
    assert value == value  # not NaN: the step computed correctly
    i += 1
    if i % 20 == 0:
        print(f"hb {i}", flush=True)
    time.sleep(0.01)
done.set()
w.join()
print(f"DONE {i} torch-still-fine={torch.ones(2).sum().item() == 2.0}", flush=True)
"""

NO_TORCH = """
import os, sys, time
stop_file = sys.argv[1]
print("READY", flush=True)
while not os.path.exists(stop_file):
    time.sleep(0.02)
print("DONE torch imported:", "torch" in sys.modules, flush=True)
"""


class Trainer:
    def __init__(self, code: str, workdir: Path) -> None:
        self.stop_file = temp_dir("fp-stop-") / "stop"
        self.workdir = workdir
        self.target: Target = spawn(code, args=(str(self.stop_file),), timeout=60)
        self.pid = self.target.pid

    def cli(self, command: str, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        # wide: a holder's path folded across two lines of a table is not found (CI, once)
        return subprocess.run([*CLI, str(self.pid), *extra, "--cmd", command], cwd=self.workdir,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200"})

    def json(self, command: str) -> dict[str, Any]:
        proc = self.cli(command, "--json")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        docs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        return docs[-1]

    def beats(self) -> int:
        found = re.findall(r"^hb (\d+)$", self.target.stdout, re.M)
        return int(found[-1]) if found else 0

    def assert_advances(self, timeout: float = 20.0) -> None:
        start = self.beats()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.beats() > start:
                return
            assert self.target.alive(), f"target died: {self.target.stderr[-2000:]}"
            time.sleep(0.05)
        raise AssertionError("the target stopped training")

    def finish(self) -> int:
        self.stop_file.touch()
        return self.target.popen.wait(30)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    t = Trainer(TRAINER, tmp_path_factory.mktemp("torch-cmds"))
    t.target.wait_for(r"hb \d+", 30)
    yield t
    t.target.stop()


def test_memory_summary_and_snapshot(trainer):
    proc = trainer.cli("torch memory")
    assert proc.returncode == 0 and "live tensors" in proc.stdout, proc.stderr
    result = trainer.json("torch memory -s -f snap.pickle")
    path = trainer.workdir / "snap.pickle"
    assert result["path"] == str(path) and result["size"] == path.stat().st_size > 0
    snap = pickle.loads(path.read_bytes())
    assert snap["flight_profiler"]["device_type"] == "cpu" and snap["flight_profiler"]["pid"] == trainer.pid
    assert snap["segments"] and snap["device_traces"] == [[]]
    trainer.assert_advances()


def test_memory_record_and_history(trainer):
    result = trainer.json("torch memory -r __main__ train_step -n 2 -f rec.pickle")
    assert result["calls_recorded"] == 2 and result["allocations"] > 0
    snap = pickle.loads((trainer.workdir / "rec.pickle").read_bytes())
    frames = [f for e in snap["device_traces"][0] for f in e["frames"]]
    assert any(f["name"] == "train_step" and f["filename"].endswith("target_main.py") for f in frames)
    proc = trainer.cli("torch memory --record-history on")
    assert proc.returncode == 2 and "CUDA-only" in proc.stderr
    trainer.assert_advances()


def test_tensors_census_finds_the_leak_and_its_growth(trainer):
    first = trainer.json("torch tensors -f c1.json")
    assert first["path"] == str(trainer.workdir / "c1.json")
    trainer.assert_advances()
    trainer.assert_advances()
    second = trainer.json("torch tensors -f c2.json --diff c1.json")
    doc = json.loads((trainer.workdir / "c2.json").read_text())
    assert doc["format"] == "flight_profiler.census" and doc["pid"] == trainer.pid
    leak = next(h for h in doc["holders"] if h["path"] == "__main__.losses[*]")
    assert leak["count"] > 20 and leak["with_grad_fn"] == leak["count"]
    grew = {h["path"]: h for h in second["diff"]["holders"]}
    assert grew["__main__.losses[*]"]["count_delta"] > 0
    # human output names the holder too
    proc = trainer.cli("torch tensors --top 5 -f c3.json")
    assert proc.returncode == 0 and "__main__.losses[*]" in proc.stdout
    trainer.assert_advances()


def test_profile_method_window_schedule_tensorboard(trainer):
    result = trainer.json("torch profile __main__ train_step -n 2 --with-stack --record-shapes -f p.json.gz")
    with gzip.open(trainer.workdir / "p.json.gz", "rt") as f:
        trace = json.load(f)
    assert {"aten::addmm", "aten::mm"} <= {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert trace["distributedInfo"] == {"rank": 0} and result["calls_recorded"] == 2
    trainer.assert_advances()

    window = trainer.json("torch profile --duration 1 -f w.json")
    trace = json.loads((trainer.workdir / "w.json").read_text())
    tids = {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert window["all_threads"] and len(tids) >= 2  # the main thread and the side worker
    trainer.assert_advances()

    tb = trainer.json("torch profile __main__ train_step --schedule 1,1,2 --tensorboard tb --label run1")
    assert Path(tb["path"]).parent == trainer.workdir / "tb" / "plugins" / "profile" / "run1"
    assert tb["calls_recorded"] == 4
    default = trainer.json("torch profile __main__ train_step")
    assert re.fullmatch(rf"fp-{trainer.pid}-profile-\d{{8}}-\d{{6}}\.pt\.trace\.json\.gz",
                        Path(default["path"]).name)
    assert Path(default["path"]).parent == trainer.workdir
    trainer.assert_advances()


def test_typo_and_timeout_are_one_line_errors(trainer):
    proc = trainer.cli("torch profile __main__ trian_step --timeout 1")
    assert proc.returncode == 1 and "did you mean 'train_step'" in proc.stderr
    assert "Traceback" not in proc.stderr
    trainer.assert_advances()


def test_ctrl_c_while_waiting_removes_the_hook(trainer):
    proc = subprocess.Popen([*CLI, str(trainer.pid), "--cmd", "torch profile __main__ worker --timeout 60"],
                            cwd=trainer.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # attached and waiting for a call that never comes (worker() runs once, already)
    deadline = time.monotonic() + 30
    while "profile of __main__.worker" not in trainer.cli("status").stdout:
        assert time.monotonic() < deadline and proc.poll() is None, "the hook never showed up"
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    status = trainer.cli("status")
    assert re.search(r"instrumentation\s+none", status.stdout), status.stdout
    trainer.assert_advances()


def test_profile_window_around_a_forward_holds_whole_steps(trainer):
    # GIVEN a user naming the model's forward, which runs inside train_step before its backward
    result = trainer.json("torch profile torch.nn.modules.container Sequential forward -n 3 "
                          "--window --with-stack -f around.json.gz")
    assert result["mode"] == "around" and result["all_threads"]
    assert result["calls_entered"] >= 4 and result["optimizer_steps"]["#0 SGD"] >= 4
    # THEN the trace marks the calls, each optimizer step and each backward, and the report
    # finds the step (SGD.step) with the forward inside it, once a step
    from flight_profiler.report import analyze

    with gzip.open(trainer.workdir / "around.json.gz", "rt") as f:
        names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"]
    # the 3 calls asked for (-n 3); calls_entered also counts the probe call, watched before the
    # session started, and on a quiet machine no 4th call begins before the session stops
    assert names.count("flight_profiler.call#torch.nn.modules.container.Sequential.forward") >= 3
    assert names.count("flight_profiler.optimizer_step#0 SGD") >= 4
    assert names.count("flight_profiler.backward") >= 3
    step = analyze([str(trainer.workdir / "around.json.gz")]).inputs[0].data["step"]
    assert step["kind"] == "optimizer" and step["name"] == "SGD.step" and step["whole_steps"] >= 3
    assert step["method"]["role"] == "inside the step" and step["method"]["calls_per_step"] == 1
    # and every hook (the forward's, backward's, the optimizer's) is gone
    status = trainer.cli("status")
    assert re.search(r"instrumentation\s+none", status.stdout), status.stdout
    trainer.assert_advances()


def test_ctrl_c_stops_a_window_and_its_profiler(trainer):
    # GIVEN a window around a method that is never called again
    proc = subprocess.Popen([*CLI, str(trainer.pid), "--cmd",
                             "torch profile __main__ worker -n 3 --window --timeout 60"],
                            cwd=trainer.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    # the window first watches one call without a profiler (the probe: does the method hold a
    # whole step?); a method never called again is cancelled there, or in the window itself
    while not re.search(r"(probe of|profile window around) __main__\.worker", trainer.cli("status").stdout):
        assert time.monotonic() < deadline and proc.poll() is None, "the window never started"
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    status = trainer.cli("status")
    assert re.search(r"instrumentation\s+none", status.stdout), status.stdout
    # THEN its all-threads session is stopped too: a new one starts and records
    window = trainer.json("torch profile --duration 0.5 -f after-cancel.json")
    assert window["all_threads"] and (trainer.workdir / "after-cancel.json").stat().st_size > 0
    trainer.assert_advances()


def test_zz_target_exits_cleanly_and_output_is_untouched(trainer):
    # named zz: runs last in this module (pytest keeps file order)
    assert trainer.finish() == 0, trainer.target.stderr
    assert "torch-still-fine=True" in trainer.target.stdout
    assert not any(line and not (line.startswith(("hb ", "DONE", "READY"))) for line in trainer.target.stdout.splitlines())
    # nothing on its stderr either: not even torch's profiler warnings (collection.cpp:664,
    # "aten::addmm (function operator())"), which our all-threads sessions made torch print
    # about one run of this file in two when they stopped while another thread was in an op
    assert trainer.target.stderr == "", trainer.target.stderr


def test_target_without_torch_gets_torch_missing(tmp_path):
    t = Trainer(NO_TORCH, tmp_path)
    try:
        proc = t.cli("torch tensors")
        assert proc.returncode == 11, proc.stderr
        assert "has not imported torch" in proc.stderr and "Traceback" not in proc.stderr
        t.finish()
        assert "torch imported: False" in t.target.stdout and t.target.popen.returncode == 0
    finally:
        t.target.stop()


WINDOW_FIRST = """
import os, sys, threading, time
import torch

stop_file = sys.argv[1]
done = threading.Event()

def worker():
    lin = torch.nn.Linear(16, 16)
    while not done.is_set():
        with torch.no_grad():
            lin(torch.randn(4, 16))
        time.sleep(0.005)

w = threading.Thread(target=worker)
w.start()
print("READY", flush=True)
while not os.path.exists(stop_file):
    time.sleep(0.02)
done.set()
w.join()
print("DONE", "inductor" if "torch._inductor" in sys.modules else "no-inductor", flush=True)
"""


def test_window_mode_as_first_profiler_use(tmp_path):
    """The first profiler start in a process, from the agent's thread: kineto complains on fd 2
    that it was not initialised from the thread that imported torch; none of that may reach the
    target's stderr, the worker thread's ops are recorded, and the target exits 0 later."""
    t = Trainer(WINDOW_FIRST, tmp_path)
    try:
        result = t.json("torch profile --duration 1 -f w.json")
        trace = json.loads((tmp_path / "w.json").read_text())
        assert result["all_threads"] and any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])
        assert t.finish() == 0
        assert t.target.stderr == "" and "DONE" in t.target.stdout
        # an inference loop never imports torch._inductor; our profile must not either
        # (torch's prepare_trace asks hasattr(torch, "_inductor"): ~800 modules, +71 MiB)
        assert "DONE no-inductor" in t.target.stdout
    finally:
        t.target.stop()


QUOTED_NAME = """
import os, sys, threading, time
import torch

stop_file = sys.argv[1]
model = torch.nn.Linear(16, 16)

def step():
    with torch.no_grad():
        return model(torch.randn(4, 16))

# torch's exporter writes Python frames' names unescaped: a name holding quotes (as one of
# torch._dynamo's polyfill frames did in a with_stack window over a training loop) made the
# whole trace invalid JSON
step.__code__ = step.__code__.replace(co_name='serve "batch"')
print("READY", flush=True)
while not os.path.exists(stop_file):
    step()
    time.sleep(0.005)
print("DONE", flush=True)
"""


def test_a_trace_torch_exports_as_invalid_json_is_mended(tmp_path):
    t = Trainer(QUOTED_NAME, tmp_path)
    try:
        result = t.json("torch profile --duration 1 --with-stack -f w.json")
        names = {e.get("name") for e in json.loads((tmp_path / "w.json").read_text())["traceEvents"]}
        assert any(n and n.endswith(': serve "batch"') for n in names), sorted(n for n in names if n)[:20]
        assert "unescaped" in result["note"] and result["top_ops"]["rows"]
        report = subprocess.run([*CLI, "report", str(tmp_path / "w.json"), "--json"], capture_output=True,
                                text=True, timeout=120)
        assert report.returncode == 0, report.stderr
        assert t.finish() == 0
        assert t.target.stderr == "" and "DONE" in t.target.stdout
    finally:
        t.target.stop()
