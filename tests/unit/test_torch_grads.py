"""torch grads: per-parameter gradient health, the first non-finite layer, and whether grads are
zeroed between steps. In-process: the handler runs in its own thread as in the agent, the test
thread plays the target's training loop (state in a function's locals, as users write it)."""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import textwrap
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler, spec  # noqa: E402

from flight_profiler.agent import grad_stats, hooks  # noqa: E402
from flight_profiler.report.rules import grad_health  # noqa: E402


@contextlib.contextmanager
def program(name: str, source: str) -> Iterator[types.ModuleType]:
    """``source`` run as module ``name`` (a user's script, which the hooks can import), dropped
    after."""
    module = types.ModuleType(name)
    module.__file__ = f"/nonexistent/{name}.py"
    sys.modules[name] = module
    try:
        exec(compile(textwrap.dedent(source), module.__file__, "exec"), module.__dict__)
        yield module
    finally:
        sys.modules.pop(name, None)
        module.__dict__.clear()
        gc.collect()

LOOPS = """
import torch

class Trainer:
    def __init__(self, zero_grad=True, lr=0.01, poison=False):
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.zero = zero_grad
        self.poison = poison

    def step(self, i):
        x = torch.randn(16, 8)
        if self.poison and i >= 2:
            x = x * float("nan")
        loss = self.model(x).pow(2).mean()
        if self.zero:
            self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


class QLearner:
    # The DQN tutorial's shape: a policy net stepped by AdamW, a target net for the targets,
    # soft-updated from the policy's weights.

    def __init__(self, target_with_grad):
        self.policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        self.target = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        self.target.load_state_dict(self.policy.state_dict())
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=1e-3)
        self.with_grad = target_with_grad

    def step(self, i):
        s, s2 = torch.randn(32, 4), torch.randn(32, 4)
        q = self.policy(s).max(1).values
        if self.with_grad:
            nxt = self.target(s2).max(1).values
        else:
            with torch.no_grad():
                nxt = self.target(s2).max(1).values
        loss = torch.nn.functional.smooth_l1_loss(q, 0.99 * nxt + 1.0)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            for p, t in zip(self.policy.parameters(), self.target.parameters()):
                t.mul_(0.995).add_(p, alpha=0.005)
        return loss.item()
"""


@pytest.fixture
def loops():
    with program("fp_grads_workload", LOOPS) as module:
        yield module


def _grads(tmp_path: Path, trainer: Any, calls: int = 4, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    cls = type(trainer).__name__
    i = [0]

    def drive() -> None:
        trainer.step(i[0])
        i[0] += 1

    out = tmp_path / "g.json"
    args = {"target": spec("fp_grads_workload", "step", cls), "calls": calls, "timeout": 30,
            "path": str(out), **kw}
    result, _ = run_handler("torch grads", args, drive)
    return result, json.loads(out.read_text())


def test_healthy_loop_reports_finite_grads_and_zeroing(loops, tmp_path):
    trainer = loops.Trainer(zero_grad=True)
    _, doc = _grads(tmp_path, trainer)
    assert doc["format"] == "flight_profiler.grads" and doc["mode"] == "method"
    (model,) = [m for m in doc["models"] if m["class"].endswith("Sequential")]
    assert model["name"].endswith("trainer.model") or model["name"].endswith(".model"), model["name"]
    assert [layer["name"] for layer in model["layers"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    idx = doc["models"].index(model)
    assert len(doc["measurements"]) == 4
    for m in doc["measurements"]:
        figures = m["models"][idx]
        assert figures["with_grad"] == 4 and figures["nonfinite_grad_layers"] == 0
        # The total is the L2 of the layers' L2 norms (clip_grad_norm_'s definition).
        norms = [row[0] for row in figures["layers"]]
        assert figures["grad_norm"] == pytest.approx(sum(n * n for n in norms) ** 0.5, rel=1e-4)
    (opt,) = [o for o in doc["optimizers"] if o["model"] == idx]
    # Counted over the whole window (the loop keeps running around the measured calls).
    assert opt["steps"] >= 4 and abs(opt["zero_grad_calls"] - opt["steps"]) <= 1, opt
    assert grad_health.findings_for(doc, "g.json") == []
    # Nothing of ours stays on the target's functions once the request is over.
    assert hooks.active() == []


def test_missing_zero_grad_is_named_as_root_cause(loops, tmp_path):
    trainer = loops.Trainer(zero_grad=False)
    _, doc = _grads(tmp_path, trainer, calls=5)
    idx = next(i for i, m in enumerate(doc["models"]) if m["class"].endswith("Sequential"))
    norms = [m["models"][idx]["grad_norm"] for m in doc["measurements"]]
    assert all(b > a for a, b in zip(norms, norms[1:])), norms
    findings = grad_health.findings_for(doc, "g.json")
    acc = [f for f in findings if f.metrics.get("pattern") == "grads-accumulating"]
    assert acc, [f.title for f in findings]
    assert "zero_grad" in acc[0].root_cause and "never" in acc[0].root_cause
    assert any("optimizer.zero_grad()" in fix for fix in acc[0].fix)


def test_first_nonfinite_layer_is_named_in_module_order(loops, tmp_path):
    trainer = loops.Trainer(poison=True)
    _, doc = _grads(tmp_path, trainer, calls=4)
    findings = grad_health.findings_for(doc, "g.json")
    nf = [f for f in findings if f.metrics.get("pattern") == "non-finite"]
    assert nf and nf[0].severity == "critical"
    assert nf[0].metrics["first_layer"] == "0.weight", nf[0].metrics
    bad = [m["models"][0]["nonfinite_grad_layers"] for m in doc["measurements"]]
    assert bad[-1] == 4 and nf[0].metrics["first_measurement"] == next(i for i, b in enumerate(bad) if b)


def test_snapshot_mode_keeps_no_reference_to_the_model(tmp_path):
    def main() -> tuple[weakref.ref[Any], dict[str, Any]]:
        model = torch.nn.Linear(4, 2)  # held only by this function's locals
        model(torch.randn(3, 4)).sum().backward()
        result, _ = run_handler("torch grads", {"path": str(tmp_path / "s.json")})
        return weakref.ref(model), result

    ref, result = main()
    gc.collect()
    assert ref() is None, "torch grads kept the target's model alive"
    linear = [m for m in result["models"] if m["class"] == "torch.nn.modules.linear.Linear"]
    assert any(m["name"].endswith("main() local model") for m in linear), [m["name"] for m in linear]
    assert result["zeroing"] == {"observed": False}


def test_sparse_and_meta_parameters_do_not_break_the_measurement():
    from flight_profiler.agent import grad_stats

    emb = torch.nn.Embedding(50, 8, sparse=True)
    emb(torch.tensor([1, 2, 3])).sum().backward()
    meta = torch.nn.Linear(4, 4, device="meta")
    lin = torch.nn.Linear(4, 1)
    lin(torch.randn(2, 4)).sum().backward()
    params = [("emb.weight", emb.weight), *(("meta." + n, p) for n, p in meta.named_parameters()),
              *(("lin." + n, p) for n, p in lin.named_parameters())]
    figures = grad_stats.measure(torch, params)
    assert figures["with_grad"] == 3 and figures["unreadable"] == 2 and figures["without_grad"] == 0
    # Three rows of each one in the sparse embedding: norm of its values (3 rows of ones).
    assert figures["layers"][0][0] == pytest.approx((3 * 8) ** 0.5, rel=1e-5)
    assert figures["layers"][1] is None and figures["weight_norms"][1] is None
    assert figures["layers"][4][0] == pytest.approx(float(lin.bias.grad.norm()), rel=1e-5)


def test_method_calls_report_what_they_save_for_backward(loops, tmp_path):
    loops.Trainer.evaluate = lambda self, i: self.model(torch.randn(256, 8)).sum().item()  # grad on
    trainer = loops.Trainer()
    i = [0]

    def drive() -> None:
        trainer.step(i[0])
        trainer.evaluate(i[0])
        i[0] += 1

    for method, built_and_unused in (("evaluate", True), ("step", False)):
        out = tmp_path / f"{method}.json"
        run_handler("torch grads", {"target": spec("fp_grads_workload", method, "Trainer"), "calls": 3,
                                    "timeout": 30, "path": str(out)}, drive)
        doc = json.loads(out.read_text())
        costs = [m["autograd"] for m in doc["measurements"]]
        floor = 256 * 16 * 4 if method == "evaluate" else 1  # evaluate: batch 256 x hidden 16
        assert all(c["grad_enabled"] and c["saved_bytes"] >= floor for c in costs), costs
        assert all((c["unpacked"] == 0) == built_and_unused for c in costs), (method, costs)


def _name_while_a_local_holds_a_parameter() -> list[str]:
    # No assert here: pytest's rewritten asserts call locals(), and before 3.13 the walk leaves
    # such a function's locals alone.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    p = next(model.parameters())  # a loop variable over the parameters, as users write them
    names = grad_stats.name_models(torch, [(model, list(model.named_parameters()))])
    del p
    return names


def test_a_model_is_named_by_its_holder_not_by_a_path_to_a_parameter():
    # GIVEN a function holding its model AND, in a local, the model's first parameter
    # THEN the model is named where it lives, not "<Sequential at 0x...>"
    assert _name_while_a_local_holds_a_parameter() == \
        [f"{__name__}._name_while_a_local_holds_a_parameter() local model"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.float32])
def test_models_of_every_float_dtype_are_measured(dtype: Any) -> None:
    # `model.double()` is how pytorch/examples' time-sequence LBFGS program trains: its
    # parameters were all "unreadable" (a narrowing dtype= is refused), and `torch grads` then
    # printed "gradients finite, not exploding" over nothing read.
    lin = torch.nn.Linear(64, 8).to(dtype)
    lin(torch.randn(4, 64, dtype=dtype)).pow(2).sum().backward()
    figures = grad_stats.measure(torch, list(lin.named_parameters()))
    assert figures["unreadable"] == 0 and figures["with_grad"] == 2
    want = float(lin.weight.grad.double().norm())
    assert figures["layers"][0][0] == pytest.approx(want, rel=1e-2)
    assert figures["weight_norms"][0] == pytest.approx(float(lin.weight.double().norm()), rel=1e-2)


def test_half_precision_norms_do_not_overflow() -> None:
    # 70,000 gradients of 300: the norm (about 79,000) is past float16's largest value (65,504).
    p = torch.nn.Parameter(torch.zeros(70_000, dtype=torch.float16))
    p.grad = torch.full_like(p, 300.0)
    figures = grad_stats.measure(torch, [("p", p)])
    assert figures["layers"][0][0] == pytest.approx(300.0 * 70_000 ** 0.5, rel=1e-3)
    assert figures["nonfinite_grad_layers"] == 0


def test_unreadable_parameters_are_said_not_judged_healthy() -> None:
    # A model whose parameters cannot be measured (here: meta tensors) is not "healthy": the
    # report says what it could not read, at info, and passes no verdict on it.
    meta = torch.nn.Linear(4, 4, device="meta")
    doc = {"models": [{"name": "__main__.net", "class": "torch.nn.Linear", "numel": 20, "params": 2,
                       "layers": []}],
           "measurements": [{"models": [grad_stats.measure(torch, list(meta.named_parameters()))]}
                            for _ in range(3)],
           "optimizers": [], "zeroing": {"observed": False}}
    (found,) = grad_health.findings_for(doc, "g.json")
    assert found.severity == "info" and found.metrics["pattern"] == "unreadable"
    assert "2 of 2 parameter tensors" in found.title and "nothing of this model" in found.summary
    # a readable model gets no such finding
    lin = torch.nn.Linear(4, 4)
    lin(torch.randn(2, 4)).sum().backward()
    doc["measurements"] = [{"models": [grad_stats.measure(torch, list(lin.named_parameters()))]}]
    assert grad_health.findings_for(doc, "g.json") == []


def test_gradients_written_into_a_network_no_optimizer_steps_are_named(loops, tmp_path):
    # The DQN tutorial's target network run with autograd on: backward fills its grads, which no
    # optimizer holds and nothing zeroes. Before, with a method nothing was said (norms rise
    # too slowly to look like accumulation), and without one "exploding: clip the gradients".
    for with_grad in (True, False):
        _, doc = _grads(tmp_path, loops.QLearner(with_grad), calls=4)
        found = grad_health.findings_for(doc, "g.json")
        if not with_grad:
            assert found == [], [f.title for f in found]
            continue
        (f,) = found
        assert f.metrics["pattern"] == "unstepped-grads" and f.severity == "warning"
        assert f.metrics["model"].endswith("target"), f.metrics
        assert "no_grad" in f.fix[0] and "requires_grad_(False)" in f.fix[1]
        # each optimizer says every model it holds parameters of
        policy = next(i for i, m in enumerate(doc["models"]) if m["name"].endswith("policy"))
        assert [o["models"] for o in doc["optimizers"]] == [[policy]]
    assert hooks.active() == []


def test_a_model_trained_by_an_optimizer_over_two_models_is_not_unstepped():
    # One optimizer over a GAN's both halves (itertools.chain): each is held, nothing to say.
    norms = [[1.0, 2.0], [1.5, 2.5], [2.0, 3.0]]
    doc = {"models": [{"name": f"m.{n}", "class": "torch.nn.Linear", "numel": 10, "params": 2,
                       "layers": []} for n in ("g", "d")],
           "measurements": [{"models": [{"grad_norm": a, "with_grad": 2}, {"grad_norm": b, "with_grad": 2}]}
                            for a, b in norms],
           "optimizers": [{"class": "torch.optim.adam.Adam", "params": 4, "model": 0, "models": [0, 1],
                           "steps": 6, "zero_grad_calls": 6}],
           "zeroing": {"observed": True, "module_zero_grad_calls": [0, 0], "backward_calls": 6}}
    assert [f for f in grad_health.findings_for(doc, "g.json")
            if f.metrics.get("pattern") == "unstepped-grads"] == []
    # the same optimizer seen as holding only the first: the second is named
    doc["optimizers"][0]["models"] = [0]
    (f,) = [f for f in grad_health.findings_for(doc, "g.json") if f.metrics.get("pattern") == "unstepped-grads"]
    assert f.metrics["model"] == "m.d"


def test_fixes_name_the_model_as_code_would():
    # "`run_style_transfer() local model.requires_grad_(False)`" was the neural-transfer
    # tutorial's fix: the holder path, not an expression.
    assert grad_health.variable("run_style_transfer() local model") == "model"
    assert grad_health.variable("main() local trainer.nets[0]") == "trainer.nets[0]"
    assert grad_health.variable("__main__.target_net") == "target_net"
    assert grad_health.variable("<DQN at 0x7f00>") == "model"
    assert grad_health.variable("f() local d['k']") == "model"


CHAR_RNN = """
import torch

class Cell(torch.nn.Module):
    # practical-pytorch's char-rnn-generation: forward once per character, hidden in and out
    def __init__(self):
        super().__init__()
        self.i2h = torch.nn.Linear(8 + 16, 16)
        self.h2o = torch.nn.Linear(16, 8)

    def forward(self, x, hidden):
        hidden = torch.tanh(self.i2h(torch.cat([x, hidden], 1)))
        return self.h2o(hidden), hidden

cell = Cell()
opt = torch.optim.Adam(cell.parameters(), lr=1e-3)

def train(chunk_len=12):
    hidden = torch.zeros(1, 16)
    opt.zero_grad()
    loss = 0
    for c in range(chunk_len):
        output, hidden = cell(torch.randn(1, 8), hidden)
        loss = loss + output.pow(2).mean()
    loss.backward()
    opt.step()
    return loss.item()
"""


def _char_rnn_grads(tmp_path: Path) -> dict[str, Any]:
    with program("fp_char_rnn", CHAR_RNN) as module:
        out = tmp_path / "g.json"
        run_handler("torch grads", {"target": spec("fp_char_rnn", "forward", "Cell"), "calls": 4,
                                    "timeout": 30, "path": str(out)}, module.train)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_calls_of_a_forward_run_many_times_a_step_are_judged_by_the_step_s_backward(tmp_path):
    # 4 calls of a forward called 12 times a step are all in before the step's backward: what
    # was said of them then (no backward read their graphs, `hidden` chained from call to call)
    # was a critical graph-chain and an evaluation-with-grad warning on a healthy program.
    from flight_profiler.report.models import InputResult
    from flight_profiler.report.rules import Context, eval_with_grad, graph_chain

    doc = _char_rnn_grads(tmp_path)
    zeroing = doc["zeroing"]
    assert zeroing["backward_after_calls"] is True and zeroing["backward_calls"] >= 1, zeroing
    costs = [m["autograd"] for m in doc["measurements"]]
    # the step's backward read what each measured call saved, after the call returned
    assert all(c["unpacked"] == 0 and c["unpacked_after"] > 0 for c in costs), costs
    assert eval_with_grad.live_evidence(doc) is None
    ctx = Context(grads=[InputResult(path=str(tmp_path / "g.json"), kind="grads", ok=True, data=doc)])
    assert graph_chain._from_calls(ctx) == []


def test_evaluation_with_grad_is_evidence_once_a_backward_came_and_read_none_of_it(loops, tmp_path):
    from flight_profiler.report.rules import eval_with_grad

    loops.Trainer.evaluate = lambda self, i: self.model(torch.randn(256, 8)).sum().item()  # grad on
    trainer = loops.Trainer()
    i = [0]

    def drive() -> None:
        trainer.step(i[0])
        trainer.evaluate(i[0])
        i[0] += 1

    out = tmp_path / "evaluate.json"
    run_handler("torch grads", {"target": spec("fp_grads_workload", "evaluate", "Trainer"), "calls": 3,
                                "timeout": 30, "path": str(out)}, drive)
    doc = json.loads(out.read_text())
    assert doc["zeroing"]["backward_after_calls"] is True
    assert all(m["autograd"]["unpacked_after"] == 0 for m in doc["measurements"])
    # the optimizer stepped while measured: before, that alone made the calls no evidence
    assert any(o["steps"] > 0 for o in doc["optimizers"])
    found = eval_with_grad.live_evidence(doc)
    assert found is not None and found["calls"] == 3


DDP_LOOP = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
ddp_model = DDP(model)
opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

def step(bypass):
    opt.zero_grad()
    out = model(torch.randn(4, 8)) if bypass else ddp_model(torch.randn(4, 8))
    out.pow(2).mean().backward()
    opt.step()
"""


@pytest.mark.parametrize("bypass", [False, True])
def test_a_loop_that_calls_the_module_ddp_wraps_is_seen(tmp_path, bypass):
    # the DDP tutorial's ToyModel trained through `model(x)` instead of `ddp_model(x)`: no
    # backward all-reduces, each rank trains its own copy (a 1-rank group here: the counts)
    import torch.distributed as dist

    from flight_profiler.report.rules import grad_health

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        with program("fp_ddp_loop", DDP_LOOP) as module:
            out = tmp_path / "g.json"
            run_handler("torch grads", {"calls": 3, "interval": 0.2, "timeout": 30, "path": str(out)},
                        lambda: module.step(bypass))
            doc = json.loads(out.read_text())
    finally:
        dist.destroy_process_group()
    [ddp] = doc["zeroing"]["ddp"]
    assert ddp["world_size"] == 1 and doc["models"][ddp["model"]]["class"].endswith("DistributedDataParallel")
    assert (ddp["forward_calls"] == 0) == bypass, ddp
    assert not [f for f in grad_health.findings_for(doc, "g.json")
                if f.metrics.get("pattern") == "ddp-bypassed"]  # one rank loses nothing
    # the same counts with two ranks: critical, the wrapper named in the fix
    ddp["world_size"] = 2
    found = [f for f in grad_health.findings_for(doc, "g.json") if f.metrics.get("pattern") == "ddp-bypassed"]
    if bypass:
        assert [f.severity for f in found] == ["critical"]
        assert "ddp_model(inputs)" in found[0].fix[0] and "2 ranks" in found[0].summary
    else:
        assert found == []


NAME_CLASSIFIER = """
import time

import torch
import torch.nn as nn

class RNN(nn.Module):
    # the PyTorch tutorial's name classifier: forward once per letter, a hand-written update
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        return self.softmax(self.i2o(combined)), self.i2h(combined)

rnn = RNN(57, 32, 18)
criterion = nn.NLLLoss()

def train(zero_grad, letters=30):
    hidden = torch.zeros(1, rnn.hidden_size)
    if zero_grad:
        rnn.zero_grad()
    for i in range(letters):
        output, hidden = rnn(torch.randn(1, 57), hidden)
        time.sleep(0.001)  # a letter's worth of the tutorial's input work
    loss = criterion(output, torch.tensor([3]))
    loss.backward()
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-0.005)
    return output, loss.item()
"""


@pytest.mark.parametrize("zero_grad", [True, False])
def test_a_forward_called_per_letter_sees_whether_the_loop_zeroes(tmp_path, zero_grad):
    # 4 forward calls of one name are all in before its one backward: one backward pass said
    # nothing of zeroing, so the tutorial's forgotten rnn.zero_grad() (its loss NaN soon after)
    # got the NaN's fix instead of zero_grad's, in some runs (issue 18)
    with program("fp_name_rnn", NAME_CLASSIFIER) as module:
        module.train(True)
        if not zero_grad:  # what accumulating without zero_grad comes to: an overflowed .grad
            module.rnn.i2o.bias.grad.fill_(float("inf"))
        out = tmp_path / "g.json"
        run_handler("torch grads", {"target": spec("fp_name_rnn", "forward", "RNN"), "calls": 4,
                                    "timeout": 30, "path": str(out)}, lambda: module.train(zero_grad))
        doc = json.loads(out.read_text())
    zeroing = doc["zeroing"]
    assert zeroing["waited_for_backward_s"] < 2.0, zeroing
    findings = grad_health.findings_for(doc, "g.json")
    if zero_grad:
        assert zeroing["module_zero_grad_calls"][0] >= 1, zeroing
        assert findings == [], [f.title for f in findings]
    else:
        assert zeroing["backward_calls"] >= 2 and zeroing["module_zero_grad_calls"] == [0], zeroing
        patterns = {f.metrics.get("pattern") for f in findings}
        assert "grads-accumulating" in patterns, [f.title for f in findings]
        accumulating = next(f for f in findings if f.metrics.get("pattern") == "grads-accumulating")
        assert accumulating.severity == "critical" and "rnn.zero_grad()" in accumulating.fix[0]


FINE_TUNING = """
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))

def build(freeze, model_zero_grad=False):
    global model_conv, optimizer_conv, zero_model
    model_conv = Net()
    if freeze:
        for param in model_conv.parameters():
            param.requires_grad = False
    model_conv.fc = nn.Linear(8, 2)
    optimizer_conv = torch.optim.SGD(model_conv.fc.parameters(), lr=0.001, momentum=0.9)
    zero_model = model_zero_grad

def step():
    inputs, labels = torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4,))
    (model_conv.zero_grad if zero_model else optimizer_conv.zero_grad)()
    with torch.set_grad_enabled(True):
        loss = nn.functional.cross_entropy(model_conv(inputs), labels)
        loss.backward()
        optimizer_conv.step()
"""


@pytest.mark.parametrize("case", ["frozen", "unfrozen", "unfrozen, model.zero_grad()"])
def test_a_backbone_left_unfrozen_beside_an_optimizer_over_the_head_is_named(tmp_path, case):
    # the fine-tuning tutorial's "fixed feature extractor" with its freezing loop left out: the
    # optimizer gets fc's parameters only; the backbone's gradients are computed every backward
    # and, its zero_grad() clearing only fc, add up. The model is stepped (by fc), so the
    # whole-model check said nothing.
    with program("fp_fine_tuning", FINE_TUNING) as module:
        module.build(freeze=case == "frozen", model_zero_grad="model.zero_grad" in case)
        out = tmp_path / "g.json"
        run_handler("torch grads", {"target": spec("fp_fine_tuning", "step"), "calls": 4,
                                    "timeout": 30, "path": str(out)}, module.step)
        doc = json.loads(out.read_text())
    findings = grad_health.findings_for(doc, "g.json")
    if case != "unfrozen":
        assert findings == [], [f.title for f in findings]
        return
    (f,) = findings
    assert f.metrics["pattern"] == "unstepped-layers" and f.severity == "warning", f.title
    assert f.metrics["layers"] == ["features.0.weight", "features.0.bias"]
    assert f.metrics["numel"] == 8 * 3 * 3 * 3 + 8
    assert "fc" in f.summary and "model_conv.parameters(): param.requires_grad = False" in f.fix[0]
    norms = f.metrics["grad_norms"]  # sums of random gradients: changing, not always rising
    assert len(norms) == 4 and len(set(norms)) == 4, norms
    assert hooks.active() == []


def test_unstepped_layers_in_a_hostile_grads_file_are_refused(tmp_path):
    from flight_profiler.report import grads

    doc = {"format": "flight_profiler.grads", "version": 1,
           "models": [{"name": "m", "class": "Net", "numel": 10, "params": 2,
                       "layers": [{"name": "w", "shape": [10]}], "unstepped_layers": [-1]}],
           "measurements": []}
    with pytest.raises(grads.GradsFormatError, match=r"unstepped_layers\[0\]"):
        grads.parse_grads(json.dumps(doc))
    doc["models"][0]["unstepped_layers"] = [0]
    assert grads.parse_grads(json.dumps(doc))["models"][0]["unstepped_layers"] == [0]


def test_a_model_s_unstepped_layers_do_not_make_its_stepped_ones_explode():
    # the unfrozen backbone's gradients add up without bound; measured over the whole model
    # they read "gradient norm explodes: clip it, lower the learning rate" (the transfer-learning
    # program's mistake before), a wrong fix beside the right one. The head alone is judged.
    backbone = [1.0, 40.0, 80.0, 120.0]
    rows = [[[b, b, 0, 0, 5.0], [0.5, 0.5, 0, 0, 1.0]] for b in backbone]
    doc = {"models": [{"name": "__main__.model_conv", "class": "ResNet", "numel": 110, "params": 2,
                       "layers": [{"name": "conv1.weight", "shape": [100], "numel": 100},
                                  {"name": "fc.weight", "shape": [10], "numel": 10}],
                       "unstepped_layers": [0]}],
           "measurements": [{"models": [{"grad_norm": (b * b + 0.25) ** 0.5, "with_grad": 2, "layers": r}]}
                            for b, r in zip(backbone, rows)],
           "optimizers": [{"class": "torch.optim.sgd.SGD", "params": 1, "model": 0, "models": [0],
                           "steps": 4, "zero_grad_calls": 4}],
           "zeroing": {"observed": True, "module_zero_grad_calls": [0], "backward_calls": 4}}
    assert [f.metrics["pattern"] for f in grad_health.findings_for(doc, "g.json")] == ["unstepped-layers"]
    # the head itself exploding is still said, on its own norms
    for m, k in zip(doc["measurements"], (1, 10, 100, 1000)):
        m["models"][0]["layers"][1][0] = 0.5 * k
    patterns = [f.metrics["pattern"] for f in grad_health.findings_for(doc, "g.json")]
    assert sorted(patterns) == ["exploding", "unstepped-layers"], patterns
    exploding = next(f for f in grad_health.findings_for(doc, "g.json") if f.metrics["pattern"] == "exploding")
    assert exploding.metrics["grad_norms"] == [0.5, 5.0, 50.0, 500.0]


PHASES = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x)
"""


def test_a_val_phases_forward_calls_are_not_measured_as_steps(tmp_path: Path) -> None:
    # GIVEN the tutorials' train/val epoch: 4 training batches, then 6 under no_grad, with the
    # model's forward named (measuring after eval calls read a constant norm as "exploding")
    with program("fp_grads_phases", PHASES) as module:
        model = module.Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        i = [0]

        def drive() -> None:
            x = torch.randn(4, 8)
            if i[0] % 10 < 4:
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
            else:
                with torch.no_grad():
                    model(x)
            i[0] += 1

        i[0] = 4  # the measuring begins in the val phase
        out = tmp_path / "g.json"
        run_handler("torch grads", {"target": spec("fp_grads_phases", "forward", "Net"), "calls": 3,
                                    "timeout": 30, "path": str(out)}, drive)
        doc = json.loads(out.read_text())
    # THEN the calls measured are the training ones, with grad on
    assert len(doc["measurements"]) == 3
    assert all(m["autograd"]["grad_enabled"] for m in doc["measurements"])


def test_an_optimizers_step_is_measured_though_it_runs_with_grad_off(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a training loop with the optimizer's step named: torch runs step's body under
    # no_grad, where the hook's entry is, yet every step follows a backward
    from flight_profiler.agent.commands import torch_grads
    monkeypatch.setattr(torch_grads, "NO_GRAD_PATIENCE_S", 60.0)  # no fallback within the test
    with program("fp_grads_step", PHASES) as module:
        model = module.Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def drive() -> None:
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()

        out = tmp_path / "g.json"
        run_handler("torch grads", {"target": spec("torch.optim.sgd", "step", "SGD"),
                                    "calls": 3, "timeout": 10, "path": str(out)}, drive)
        doc = json.loads(out.read_text())
    # THEN its calls are measured, not waited past
    assert len(doc["measurements"]) == 3
    assert all(m["models"][0]["grad_norm"] > 0 for m in doc["measurements"])
