"""eval-with-grad: evaluation/inference that runs with autograd on and never runs a backward.

Evidence, from a profile: operators recorded with an autograd sequence number (the profiler
records one for every op dispatched with grad mode on; ops under ``torch.no_grad()`` or
``torch.inference_mode()`` have none), model-like compute among them (matmul, linear,
convolution, attention...), and not one backward function in the same window. Each such op
builds a graph node and keeps its inputs alive until the output is dropped.

Limit: grad mode on for ops whose inputs need no grad (pure data preprocessing) records
sequence numbers too, without building anything; requiring model compute among them and
several per step keeps that case out in practice, not in principle (hence a warning).
"""

from __future__ import annotations

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T

MODEL_OPS = ("linear", "addmm", "matmul", "aten::mm", "bmm", "conv", "embedding", "layer_norm",
             "scaled_dot_product", "lstm", "gru", "rnn", "baddbmm", "einsum")


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for inp in ctx.traces:
        ag = inp.data.get("autograd") or {}
        recording = int(ag.get("forward_ops_recording") or 0)
        if recording < T.eval_grad_min_ops or int(ag.get("backward_functions") or 0) > 0:
            continue
        top = ag.get("top_recording_ops") or []
        model_ops = [r for r in top if any(k in str(r.get("name", "")).lower() for k in MODEL_OPS)]
        if not model_ops:
            continue
        name = inp.data.get("trace_name") or label(inp)
        out.append(Finding(
            rule="eval-with-grad", severity="warning",
            title="inference runs with autograd on (graphs built, never used by a backward)",
            summary=(f"{label(inp)}: {recording} operators ran with grad mode on and recorded autograd "
                     "information, and no backward ran in the window: every forward builds a graph that "
                     "keeps its activations alive until the outputs are dropped."),
            evidence=[f"operators recorded with an autograd sequence number: {recording}",
                      "backward functions (autograd::engine::evaluate_function): 0",
                      "model compute among them: " + ", ".join(f"{r['name']} x{r['calls']}" for r in model_ops[:5])],
            where=[str(name)],
            root_cause=("The evaluation/inference code path is not wrapped in torch.no_grad() or "
                        "torch.inference_mode(), and the model's parameters require grad."),
            fix=["Wrap the evaluation in `with torch.inference_mode():` (or decorate the method with "
                 "`@torch.inference_mode()`); use `torch.no_grad()` if the outputs are later used in autograd.",
                 "Call `model.eval()` as well (dropout/batch-norm behaviour; it does not turn autograd off).",
                 "Measured on CPU (bench/bench_grads.py, docs/commands-torch-grads.md): grad on costs both "
                 "time and the activations' memory for as long as the outputs live."],
            inputs=[inp.path],
            metrics={"forward_ops_recording": recording, "backward_functions": 0, "model_ops": model_ops}))
    return out


RULE = Rule("eval-with-grad", "Evaluation or inference with autograd on", check)
