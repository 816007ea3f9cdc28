"""The step model (report/steps.py) and the per-step figures that use it: a named method is
placed inside the step it runs in, and every per-step rule judges whole steps only (issue 18).

Each GIVEN is a training loop as the agent's window profile records it (step_synth.py); the
numbers are chosen so that the old per-call reading of the same loop gives the false alarms the
issue measured.
"""

from __future__ import annotations

from pathlib import Path

from step_synth import Loop, write

from flight_profiler.report import analyze
from flight_profiler.report.models import Finding


def _analyze(tmp_path: Path, loop: Loop) -> tuple[dict, list[Finding]]:
    report = analyze([str(write(loop, tmp_path / "loop.json.gz"))])
    return report.inputs[0].data, report.findings


def _rules(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


def test_forward_is_placed_inside_the_optimizer_step(tmp_path: Path) -> None:
    data, _ = _analyze(tmp_path, Loop(steps=6))
    step = data["step"]
    assert step["kind"] == "optimizer" and step["name"] == "SGD.step"
    assert step["whole_steps"] == 5  # 6 optimizer steps: 5 whole steps between them
    assert step["method"]["role"] == "inside the step" and step["method"]["calls_per_step"] == 1
    assert data["window_kind"] == "steps" and step["steps_per_s"] > 0


def test_a_gan_steps_once_per_iteration_with_two_optimizers(tmp_path: Path) -> None:
    data, _ = _analyze(tmp_path, Loop(steps=6, optimizers=2))
    step = data["step"]
    assert step["whole_steps"] == 5 and "optimizer #0" in step["how"] and "of 2" in step["how"]


def test_gradient_accumulation_counts_four_forwards_per_step(tmp_path: Path) -> None:
    data, _ = _analyze(tmp_path, Loop(steps=5, forwards=4))
    assert data["step"]["method"]["calls_per_step"] == 4
    assert data["step"]["method"]["role"] == "inside the step"


def test_without_an_optimizer_the_backward_marks_the_step(tmp_path: Path) -> None:
    data, _ = _analyze(tmp_path, Loop(steps=6, optimizers=0))
    assert data["step"]["kind"] == "backward" and data["step"]["whole_steps"] == 5


def test_a_method_that_holds_one_optimizer_step_is_the_step(tmp_path: Path) -> None:
    # GIVEN the marked calls span the whole iteration (a train_step calling optimizer.step())
    import gzip
    import json

    path = write(Loop(steps=6), tmp_path / "loop.json.gz")
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    calls = [e for e in doc["traceEvents"] if e.get("name", "").startswith("flight_profiler.call#")]
    ends = sorted(e["ts"] + e["dur"] for e in doc["traceEvents"]
                  if e.get("name", "").startswith("flight_profiler.optimizer_step#"))
    for call, end in zip(calls, ends):
        call["dur"] = end + 5 - call["ts"]
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    data = analyze([str(path)]).inputs[0].data
    assert data["step"]["kind"] == "method" and data["step"]["method"]["role"] == "the step"
    assert data["step"]["whole_steps"] == 5


def test_forward_calls_alone_are_a_region_not_steps_and_their_growth_no_leak(tmp_path: Path) -> None:
    # GIVEN per-call sessions of forward: each keeps 6 MiB for its backward, which runs after it
    # returns (outside the sessions). Read as steps, memory "grows 6 MiB per step" (issue 18).
    data, findings = _analyze(tmp_path, Loop(steps=8, per_call=True, forward_memory=6 << 20))
    assert not _rules(findings, "memory-leak")
    assert not _rules(findings, "eval-with-grad")  # its backward runs after it returns
    assert data["step"]["region"] is True and data["step"]["method"]["role"].startswith("a region")


def test_a_real_leak_across_whole_steps_is_still_found(tmp_path: Path) -> None:
    _, findings = _analyze(tmp_path, Loop(steps=8, leak_per_step=4 << 20, forward_memory=6 << 20))
    (leak,) = _rules(findings, "memory-leak")
    assert leak.metrics["slope_bytes_per_step"] >= 3.9 * (1 << 20)


def test_forward_memory_freed_by_the_backward_is_no_leak(tmp_path: Path) -> None:
    data, findings = _analyze(tmp_path, Loop(steps=8, forward_memory=6 << 20))
    assert not _rules(findings, "memory-leak")
    assert data["memory"]["cpu"]["slope_bytes_per_step"] == 0


def test_a_training_forward_whose_graph_the_backward_uses_is_no_eval_with_grad(tmp_path: Path) -> None:
    data, findings = _analyze(tmp_path, Loop(steps=6))
    assert data["autograd"]["unused_nodes"] == 0 and data["autograd"]["model_nodes"] > 0
    assert not _rules(findings, "eval-with-grad")


def test_an_evaluation_with_grad_on_beside_training_is_found(tmp_path: Path) -> None:
    # GIVEN the LBFGS tutorial's mistake: a prediction after each step without no_grad, while
    # the training closure's backward runs in the same steps (the old rule needed no backward)
    _, findings = _analyze(tmp_path, Loop(steps=6, eval_forward=True))
    (f,) = _rules(findings, "eval-with-grad")
    assert f.severity == "warning" and f.metrics["unused_nodes"] == 8 * 4  # 4 judged steps
    assert "no_grad" in " ".join(f.fix) and "inference_mode" in f.fix[0]


def test_a_validation_pass_once_an_epoch_with_grad_on_is_found_however_diluted(tmp_path: Path) -> None:
    # GIVEN a DDP trainer's rank 0 validating after every 64 steps without no_grad (48 nodes a
    # pass): 0.7 unused nodes a step over the window, under the per-step bar, all of them in a row
    _, findings = _analyze(tmp_path, Loop(steps=130, eval_forward=True, eval_every=64, eval_nodes=48,
                                          step_us=3000.0))
    (f,) = _rules(findings, "eval-with-grad")
    assert f.metrics["unused_nodes"] == 96 and f.metrics["longest_unused_run"] == 48
    assert 96 / 129 < 1.0  # per judged step: what the rule alone judged before
    assert "no_grad" in " ".join(f.fix)


def test_a_dataloader_wait_cut_by_the_end_of_the_window_is_left_out(tmp_path: Path) -> None:
    # GIVEN 0.5 ms next() per 10 ms step, and one next() of 1.8 s cut by the profiler's stop
    data, findings = _analyze(tmp_path, Loop(steps=6, dataloader_us=500, cut_dataloader_us=1_800_000))
    # the old reading counted the cut wait whole: 1.8 s of a 50 ms window
    assert not [f for f in _rules(findings, "dataloader-bottleneck") if f.severity == "critical"]
    dl = data["dataloader"]
    assert 4.0 <= dl["pct_of_window"] <= 6.0
    # left out: the cut one, and the one before the first whole step
    assert dl["left_out"] == 2 and dl["cut_us"] >= 1_800_000


def test_without_steps_a_cut_wait_is_dropped_and_said(tmp_path: Path) -> None:
    data, findings = _analyze(tmp_path, Loop(steps=6, optimizers=0, backward=False,
                                             dataloader_us=500, cut_dataloader_us=1_800_000))
    assert data["step"]["kind"] in ("method", "window")
    assert data["dataloader"]["left_out"] >= 1
    assert not [f for f in _rules(findings, "dataloader-bottleneck") if f.severity != "info"]


def test_tiny_ops_inside_a_library_operator_are_info_and_from_the_loop_a_warning(tmp_path: Path) -> None:
    # GIVEN an LSTM cell's gates: many tiny operators nested in one library operator
    _, findings = _analyze(tmp_path, Loop(steps=6, nested_tiny_ops=600, step_us=0))
    (f,) = _rules(findings, "launch-overhead")
    assert f.severity == "info" and "torch.compile" in f.fix[0]
    assert "vectoris" not in " ".join(f.fix).lower()
    # GIVEN the same count issued one by one by the program's own loop (a loop over slices)
    _, findings = _analyze(tmp_path, Loop(steps=6, python_tiny_ops=600, step_us=0))
    (g,) = _rules(findings, "launch-overhead")
    assert g.severity in ("warning", "critical") and "from Python" in g.title
    # GIVEN the same issued by a library's own Python loop (an optimizer's per-parameter loop,
    # the dcgan step's Adam.step: 100 % of its operators tiny): nothing in the program to vectorise
    _, findings = _analyze(tmp_path, Loop(steps=6, python_tiny_ops=600, step_us=0,
                                          tiny_ops_frame="torch/optim/adam.py(351): _single_tensor_adam"))
    (h,) = _rules(findings, "launch-overhead")
    assert h.severity == "info"
    # GIVEN 260 a step from the program's loop on a machine so loaded that they are 2 % of the
    # step: the count, which load does not move, still makes it a warning
    _, findings = _analyze(tmp_path, Loop(steps=6, python_tiny_ops=260, step_us=120_000))
    (k,) = _rules(findings, "launch-overhead")
    assert k.severity == "warning" and k.cost is not None and k.cost.pct < 5


def test_tiny_ops_of_a_dataset_inside_the_dataloader_are_no_loop_to_vectorise(tmp_path: Path) -> None:
    # GIVEN 260 a step issued by the program's Dataset inside a DataLoader next() in the loop's
    # own process (num_workers=0, `self.x[i]` per sample: a DDP tutorial's synthetic dataset):
    # the loader's cost, which dataloader-bottleneck judges, no loop of the program's to vectorise
    _, findings = _analyze(tmp_path, Loop(steps=6, python_tiny_ops=260, step_us=120_000,
                                          tiny_ops_in_loader=True,
                                          tiny_ops_frame="ddp_trainer.py(37): __getitem__"))
    assert [f.severity for f in _rules(findings, "launch-overhead")] in ([], ["info"])


def test_the_agents_own_frames_are_never_the_programs_line() -> None:
    # The agent's hook wrapper and its staged modules sit between the program's lines and the
    # hooked method while the window marks the calls: "where" must skip them.
    from flight_profiler.report.stacks import is_user_frame

    assert not is_user_frame("<flight_profiler hook of /work/job/train.py:28>(2): forward")
    assert not is_user_frame("/tmp/flight_profiler-0/agent-77d9ebcc/pkg/step_marks.py(51): on_enter")
    assert is_user_frame("/work/job/train.py(28): forward")


def _lbfgs_calls(path: Path, named: bool, cpu_rise: int = 0) -> Path:
    """Per-call sessions of LBFGS.step: 4 closure backward passes inside each call; the CPU
    total each session reports rises by ``cpu_rise`` (c10 misses frees between sessions)."""
    import gzip
    import json

    events: list[dict] = []
    t = 1_000_000.0
    for i in range(4):
        for name, ts, dur in ([(f"ProfilerStep#{i}", t, 100_000),
                               ("flight_profiler.call#torch.optim.lbfgs.LBFGS.step", t + 5, 99_990)]
                              + ([("flight_profiler.optimizer_step#named LBFGS", t + 10, 99_980)]
                                 if named else [])
                              + [("flight_profiler.backward", t + 1_000 + 20_000 * k, 5_000)
                                 for k in range(4)]):
            events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1,
                           "ts": ts, "dur": dur, "args": {}})
        total = (40 << 20) + i * cpu_rise
        for k, nbytes in enumerate((4096, -4096)):
            events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                           "tid": 1, "ts": t + 50_000 + 10 * k, "s": "t",
                           "args": {"Device Type": 0, "Device Id": -1, "Bytes": nbytes,
                                    "Total Allocated": total + max(nbytes, 0),
                                    "Total Reserved": total, "Addr": 7 + i}})
        t += 150_000
    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "traceEvents": events}, fh)
    return path


def test_a_named_optimizer_step_with_closure_backwards_is_the_step(tmp_path: Path) -> None:
    # GIVEN `LBFGS step` named: each call runs the closure's backward 4 times, and the agent
    # marks the call as the optimizer's step (torch's own post-hook falls outside the session)
    data = analyze([str(_lbfgs_calls(tmp_path / "named.json.gz", named=True))]).inputs[0].data
    assert data["step"]["method"]["role"] == "the step" and data["step"]["region"] is False
    assert "is an optimizer's step()" in data["step"]["how"]
    # without the mark (an older agent) the calls are only a region: no per-step claim is made
    old = analyze([str(_lbfgs_calls(tmp_path / "old.json.gz", named=False))]).inputs[0].data
    assert old["step"]["region"] is True


def test_cpu_totals_rising_across_per_call_sessions_are_no_leak(tmp_path: Path) -> None:
    # GIVEN each call its own session: c10 counts no free made between sessions, so a loop that
    # frees 1 MiB after each call reports 1 MiB more at every session (measured on torch 2.13)
    path = _lbfgs_calls(tmp_path / "rise.json.gz", named=True, cpu_rise=2 << 20)
    report = analyze([str(path)])
    cpu = report.inputs[0].data["memory"]["cpu"]
    assert "slope_bytes_per_step" not in cpu and "between them" in cpu["per_step_not_judged"]
    assert not _rules(report.findings, "memory-leak")
