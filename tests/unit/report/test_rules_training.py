"""grad-health, graph-chain and eval-with-grad on artefacts made by real torch code: a streaming
LSTM that carries its state without detaching it (censuses), an evaluation with grad on and the
same with inference_mode (profiles)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from torch_agent_helpers import run_handler  # noqa: E402

from flight_profiler.report.engine import analyze  # noqa: E402

STREAM = """
import torch

class Streamer:
    def __init__(self, detach):
        self.lstm = torch.nn.LSTM(32, 64)
        self.state = None
        self.detach = detach

    def chunk(self):
        x = torch.randn(20, 4, 32)
        out, state = self.lstm(x, self.state)
        self.state = tuple(s.detach() for s in state) if self.detach else state
        return out.mean().item()

stream = None
"""


@pytest.fixture
def streaming():
    module = types.ModuleType("fp_stream")
    module.__file__ = "/nonexistent/fp_stream.py"
    sys.modules["fp_stream"] = module
    exec(compile(textwrap.dedent(STREAM), module.__file__, "exec"), module.__dict__)
    yield module
    sys.modules.pop("fp_stream", None)
    module.__dict__.clear()
    gc.collect()


def _censuses(module, tmp_path: Path, detach: bool) -> list[str]:
    module.stream = module.Streamer(detach)
    paths = []
    for k in range(3):
        for _ in range(15):
            module.stream.chunk()
        path = tmp_path / f"c{k}.json"
        run_handler("torch tensors", {"path": str(path)})
        paths.append(str(path))
    return paths


def test_carried_lstm_state_is_a_graph_chain_with_detach_fix(streaming, tmp_path):
    paths = _censuses(streaming, tmp_path, detach=False)
    report = analyze(paths, jobs=1)
    chain = [f for f in report.findings if f.rule == "graph-chain"]
    assert chain, ([(f.rule, f.title) for f in report.findings],
                   [(json.loads(Path(p).read_text())["skipped"], [h for h in json.loads(Path(p).read_text())["holders"] if "state" in h["path"] or h["path"].startswith("<")]) for p in paths])
    f = chain[0]
    assert f.metrics["holder"].startswith("fp_stream.stream.state"), f.metrics
    assert f.severity == "critical" and ".detach()" in f.title
    graph = f.metrics["graph_bytes"]
    assert graph[0] < graph[1] < graph[2]


def test_detached_state_is_not_a_graph_chain(streaming, tmp_path):
    report = analyze(_censuses(streaming, tmp_path, detach=True), jobs=1)
    assert not [f for f in report.findings if f.rule == "graph-chain"]


def _profile(tmp_path: Path, name: str, mode: str) -> str:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    i2h, i2o = torch.nn.Linear(64, 64), torch.nn.Linear(64, 18)
    opt = torch.optim.SGD([*model.parameters(), *i2h.parameters(), *i2o.parameters()], lr=0.01)

    def step() -> None:
        x = torch.randn(32, 64)
        if mode == "grad":
            model(x)
        elif mode == "inference":
            with torch.inference_mode():
                model(x)
        elif mode == "char-rnn":  # the tutorial's RNN: an output at every character, one used
            opt.zero_grad()
            hidden = torch.zeros(1, 64)
            for _ in range(8):
                combined = torch.cat((x[:1], hidden), 1)[:, :64]
                hidden = i2h(combined)
                output = torch.log_softmax(i2o(combined), dim=1)
            torch.nn.functional.nll_loss(output, torch.tensor([1])).backward()
            opt.step()
        elif mode == "eval-each-step":  # a trained step, then a small evaluation with grad on
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            for _ in range(4):
                model(x)
        else:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    return str(path)


def test_eval_with_grad_on_is_found_and_fixed_by_inference_mode(tmp_path):
    bad = analyze([_profile(tmp_path, "grad.json", "grad")], jobs=1)
    (f,) = [f for f in bad.findings if f.rule == "eval-with-grad"]
    assert f.metrics["forward_ops_recording"] >= 20 and "inference_mode" in f.fix[0]
    for mode in ("inference", "train"):
        ok = analyze([_profile(tmp_path, f"{mode}.json", mode)], jobs=1)
        assert not [f for f in ok.findings if f.rule == "eval-with-grad"], mode


def test_an_output_computed_and_dropped_at_each_call_is_not_an_evaluation(tmp_path):
    # The PyTorch tutorial's character RNN computes i2o's output at every character and uses the
    # last one: half of the model's graph nodes are never used by a backward, in short runs
    # between used ones. That was a warning eval-with-grad on the healthy tutorial, 9 runs of 9.
    ok = analyze([_profile(tmp_path, "char.json", "char-rnn")], jobs=1)
    assert not [f for f in ok.findings if f.rule == "eval-with-grad"]
    # an evaluation with grad on after each trained step is still found: whole forwards
    bad = analyze([_profile(tmp_path, "each.json", "eval-each-step")], jobs=1)
    assert [f.rule for f in bad.findings if f.rule == "eval-with-grad"] == ["eval-with-grad"]


def test_grads_document_loads_through_the_report(tmp_path):
    doc = {"format": "flight_profiler.grads", "version": 1, "pid": 1, "time": 0.0, "mode": "method",
           "target": "m.step", "models": [{"name": "m.model", "class": "X", "params": 2, "numel": 10,
                                           "layers": [{"name": "a.weight"}, {"name": "b.weight"}]}],
           "measurements": [{"models": [{"grad_norm": v, "layers": [[v, v, 0, 0, 1.0], [0.1, 0.1, 0, 0, 1.0]],
                                         "weight_norms": [1.0, 1.0]}]} for v in (1.0, 2e3, 5e4)],
           "optimizers": [], "zeroing": {"observed": False}}
    (tmp_path / "g.json").write_text(json.dumps(doc))
    report = analyze([str(tmp_path / "g.json")], jobs=1)
    assert report.inputs[0].kind == "grads" and report.inputs[0].ok
    (f,) = [f for f in report.findings if f.rule == "grad-health"]
    assert f.metrics["pattern"] == "exploding" and "clip_grad_norm_" in f.fix[0]
    doc["measurements"][2]["models"][0]["layers"][1] = ["nan", "nan", 3, 0, 1.0]
    doc["measurements"][2]["models"][0]["grad_norm"] = "nan"
    (tmp_path / "g.json").write_text(json.dumps(doc))
    nf = [f for f in analyze([str(tmp_path / "g.json")], jobs=1).findings if f.metrics.get("pattern") == "non-finite"]
    assert nf and nf[0].metrics["first_layer"] == "b.weight" and nf[0].metrics["first_measurement"] == 2
    assert "exploded" in nf[0].root_cause


def test_unreadable_parameters_are_not_called_non_finite():
    from flight_profiler.report.rules.grad_health import findings_for

    doc = {"models": [{"name": "m", "class": "X", "numel": 2, "layers": [{"name": "meta.weight"}, {"name": "w"}]}],
           "measurements": [{"models": [{"grad_norm": 1.0, "layers": [None, [1.0, 1.0, 0, 0, 1.0]],
                                         "weight_norms": [None, 1.0]}]}], "zeroing": {"observed": False}}
    assert findings_for(doc, "g.json") == []


def test_live_calls_alone_show_eval_with_grad(tmp_path):
    def doc(unpacked: int) -> dict:
        return {"format": "flight_profiler.grads", "version": 1, "pid": 7, "time": 0.0, "mode": "method",
                "target": "svc.Service.predict",
                "models": [{"name": "svc.model", "class": "X", "params": 1, "numel": 4, "layers": [{"name": "w"}]}],
                "measurements": [{"models": [{"grad_norm": None, "layers": [None], "weight_norms": [1.0]}],
                                  "autograd": {"grad_enabled": True, "saved_tensors": 6, "saved_bytes": 3 << 20,
                                               "unpacked": unpacked}} for _ in range(3)],
                "optimizers": [], "zeroing": {"observed": True, "module_zero_grad_calls": [0]}}

    (tmp_path / "eval.json").write_text(json.dumps(doc(0)))
    (f,) = [f for f in analyze([str(tmp_path / "eval.json")], jobs=1).findings if f.rule == "eval-with-grad"]
    assert "svc.Service.predict" in f.title and "3.0 MiB" in f.summary
    (tmp_path / "train.json").write_text(json.dumps(doc(6)))  # a backward read what was saved
    assert not [f for f in analyze([str(tmp_path / "train.json")], jobs=1).findings if f.rule == "eval-with-grad"]


def test_carried_state_is_named_from_the_calls_even_when_held_by_a_local(streaming, tmp_path):
    stream = streaming.Streamer(detach=False)  # held by this function's local only

    def drive() -> None:
        stream.chunk()

    for detach, expect in ((False, True), (True, False)):
        stream.detach = detach
        stream.state = None
        path = tmp_path / f"g{int(detach)}.json"
        run_handler("torch grads", {"target": {"module": "fp_stream", "class": "Streamer", "method": "chunk",
                                               "nested": None}, "calls": 4, "timeout": 30, "path": str(path)}, drive)
        chain = [f for f in analyze([str(path)], jobs=1).findings if f.rule == "graph-chain"]
        assert bool(chain) == expect, (detach, [f.title for f in chain])
        if expect:
            assert [f.metrics["holder"] for f in chain] == ["fp_stream.Streamer.chunk: self.state[0]"]
            assert ".detach()" in chain[0].title and chain[0].metrics["links"] == [True, True, True]


def test_looking_at_a_long_chain_leaves_it_safe_to_free(tmp_path):
    """Python wrappers on a long run of graph nodes made freeing it recurse until SIGSEGV (~45 000
    nodes here): the carried-graph check must stay far below that, however long the chain."""
    script = tmp_path / "chain.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3] / "src")!r})
        import torch
        from flight_profiler.agent.carried_graphs import CarriedGraphs

        class Holder:
            pass

        holder = Holder()
        x = torch.zeros(4, requires_grad=True)
        for _ in range(60000):
            x = x * 1.0001 + 1.0
        holder.h = x
        del x
        probe = CarriedGraphs(torch)
        for _ in range(6):
            holder.h = holder.h * 1.0001
            print(probe.after_call((holder,), True, None), flush=True)
        holder.h = None
        print("freed", flush=True)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("freed"), (proc.returncode, proc.stderr[-500:])
    assert "'chained': True" in proc.stdout


def _amp_doc(norms: list[float], scales: list[float] | None, bad_grad_at: int | None = None) -> dict:
    measurements = []
    for k, v in enumerate(norms):
        row = [v, v, 0, 0, 1.0] if k != bad_grad_at else ["inf", "inf", 0, 2, 1.0]
        m: dict = {"models": [{"grad_norm": v if k != bad_grad_at else "inf", "layers": [row],
                               "weight_norms": [1.0]}]}
        if scales is not None:
            m["grad_scales"] = scales
        measurements.append(m)
    return {"models": [{"name": "net", "class": "Net", "numel": 10, "layers": [{"name": "fc.weight"}]}],
            "measurements": measurements, "zeroing": {"observed": False}}


def test_norms_read_under_an_amp_grad_scaler_are_not_an_explosion():
    from flight_profiler.report.rules.grad_health import findings_for

    # what an H100 run of a healthy AMP classifier measured: scaled (x65536) and unscaled reads
    norms = [1.844e4, 0.1795, 5772.0]
    unscaled = findings_for(_amp_doc(norms, None), "g.json")
    assert [f.metrics["pattern"] for f in unscaled] == ["exploding"]  # the old verdict, scale unknown
    assert findings_for(_amp_doc(norms, [65536.0]), "g.json") == []
    # a real explosion still shows through the scale
    (f,) = findings_for(_amp_doc([2e8, 3e8, 9e8], [65536.0]), "g.json")
    assert f.metrics["pattern"] == "exploding" and any("GradScaler" in e for e in f.evidence)


def test_an_overflowed_gradient_under_a_grad_scaler_is_info():
    from flight_profiler.report.rules.grad_health import findings_for

    (f,) = findings_for(_amp_doc([0.2, 0.3, 0.2], [65536.0], bad_grad_at=1), "g.json")
    assert f.metrics["pattern"] == "non-finite" and f.severity == "info" and "skips" in f.root_cause
    (g,) = findings_for(_amp_doc([0.2, 0.3, 0.2], None, bad_grad_at=1), "g.json")
    assert g.severity == "critical"


def test_torch_grads_reads_the_scale_of_a_live_grad_scaler(tmp_path):
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(net(torch.randn(3, 4)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    result, _ = run_handler("torch grads", {"calls": 2, "interval": 0.05, "path": str(tmp_path / "g.json")})
    assert all(m.get("grad_scales") == [1024.0] for m in result["measurements"]), result["measurements"]
    del scaler, opt, net


def test_a_hand_written_update_without_zero_grad_is_named_as_the_cause():
    # The PyTorch tutorial's character RNN: no optimizer object, `p.data.add_(p.grad.data,
    # alpha=-lr)` after each backward. With rnn.zero_grad() forgotten the gradients went NaN in
    # 500 names, and the report named only the NaN ("find the op with torch anomaly"), not why.
    from flight_profiler.report.rules.grad_health import findings_for

    def doc(zero_calls: int, backwards: int, bad_grad_at: int | None) -> dict:
        d = _amp_doc([0.4, 0.5, 0.45], None, bad_grad_at=bad_grad_at)
        d["optimizers"] = []
        d["zeroing"] = {"observed": True, "module_zero_grad_calls": [zero_calls],
                        "backward_calls": backwards}
        return d

    found = findings_for(doc(0, 600, bad_grad_at=0), "g.json")
    acc = [f for f in found if f.metrics["pattern"] == "grads-accumulating"]
    assert len(acc) == 1 and acc[0].severity == "critical"
    assert "zero_grad()" in acc[0].fix[0] and "600 backward passes" in " ".join(acc[0].evidence)
    (nan,) = [f for f in found if f.metrics["pattern"] == "non-finite"]
    assert "accumulated without zero_grad" in nan.root_cause
    # the same loop calling rnn.zero_grad(): its NaN has another cause
    (other,) = findings_for(doc(600, 600, bad_grad_at=0), "g.json")
    assert other.metrics["pattern"] == "non-finite" and "accumulated" not in other.root_cause
    # no zero_grad seen but finite, steady norms (the loop may clear p.grad itself): nothing
    assert findings_for(doc(0, 600, bad_grad_at=None), "g.json") == []


def test_a_sequence_fed_one_step_at_a_time_is_not_carried_state():
    # The tutorial's character RNN: forward once per character, hidden chained through the
    # name (as backpropagation through it needs), one backward per name, then a fresh hidden.
    # Judged call to call, every character "reached the previous call's graph": a critical
    # graph-chain on a healthy program. Only a chain that outlived a backward is carried state.
    from flight_profiler.agent.carried_graphs import CarriedGraphs

    cell = torch.nn.Linear(8, 8)
    probe = CarriedGraphs(torch)
    verdicts: list = []
    for backwards in range(3):  # one name each, then its backward
        hidden = torch.zeros(1, 8)
        for _char in range(4):
            hidden = torch.tanh(cell(hidden))
            verdicts.append(probe.after_call((), False, hidden, None, backwards)["return"])
        hidden.sum().backward()
    # within a name: chained, but with no backward between (same_step); a name's first
    # character after the last name's backward: a fresh hidden, not chained
    assert [v["chained"] for v in verdicts] == [None] + [True] * 3 + ([False] + [True] * 3) * 2
    assert [bool(v.get("same_step")) for v in verdicts] == ([False] + [True] * 3) * 3
    from flight_profiler.report.rules.graph_chain import _chained_throughout
    names = [{"return": v} for v in verdicts[4:8]]  # one name's 4 calls, measured
    assert not _chained_throughout("return", names[-1], names, trains=True)
    # no backward at all while measured (a stateful inference loop): the chain grows for ever
    assert _chained_throughout("return", names[-1], names, trains=False)
    # the classic mistake: hidden carried into the next batch, a backward between the calls
    probe = CarriedGraphs(torch)
    hidden = torch.zeros(1, 8)
    carried = []
    for step in range(3):
        hidden = torch.tanh(cell(hidden))
        carried.append(probe.after_call((), False, hidden, None, step)["return"]["chained"])
        hidden.sum().backward(retain_graph=True)
    assert carried == [None, True, True]
