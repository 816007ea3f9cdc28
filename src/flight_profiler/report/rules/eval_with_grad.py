"""eval-with-grad: evaluation/inference that runs with autograd on and never runs a backward.

Evidence, from a profile: operators recorded with an autograd sequence number (the profiler
records one for every op dispatched with grad mode on; ops under ``torch.no_grad()`` or
``torch.inference_mode()`` have none), model-like compute among them (matmul, linear,
convolution, attention...), and not one backward function in the same window. Each such op
builds a graph node and keeps its inputs alive until the output is dropped.

Evidence, from `torch grads METHOD` (live, per call): every measured call ran with grad mode on,
saved tensors for backward (activations, parameters not counted) and no backward read any of
them during the call. That is the cost measured on the program's own calls: the bytes each call
keeps alive for as long as its outputs live.

Limit: grad mode on for ops whose inputs need no grad (pure data preprocessing) records
sequence numbers too, without building anything; requiring model compute among them and
several per step keeps that case out in practice, not in principle (hence a warning).
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

MODEL_OPS = ("linear", "addmm", "matmul", "aten::mm", "bmm", "conv", "embedding", "layer_norm",
             "scaled_dot_product", "lstm", "gru", "rnn", "baddbmm", "einsum")


def unused_graphs(doc: dict[str, Any]) -> dict[str, Any] | None:
    """From a `torch grads METHOD` document: calls that built graphs no backward used, or None."""
    costs = [m.get("autograd") for m in doc.get("measurements") or []]
    if not costs or any(not isinstance(c, dict) for c in costs):
        return None
    if all(c.get("grad_enabled") and int(c.get("saved_bytes") or 0) > 0 and not c.get("unpacked") for c in costs):
        per_call = [int(c["saved_bytes"]) for c in costs]
        return {"target": doc.get("target"), "calls": len(costs), "saved_bytes": per_call,
                "saved_tensors": [int(c.get("saved_tensors") or 0) for c in costs]}
    return None


def _measured_line(u: dict[str, Any]) -> str:
    mean = sum(u["saved_bytes"]) / len(u["saved_bytes"])
    return (f"measured on {u['calls']} live calls of {u['target']}: grad mode on, {fmt_bytes(mean)} of "
            f"activations saved per call ({u['saved_tensors'][0]} tensors), read by no backward")


FIXES = ["Wrap the evaluation in `with torch.inference_mode():` (or decorate the method with "
         "`@torch.inference_mode()`); use `torch.no_grad()` if the outputs are later used in autograd.",
         "Call `model.eval()` as well (dropout/batch-norm behaviour; it does not turn autograd off).",
         "Measured on CPU (bench/bench_grads.py, docs/commands-torch-grads.md): grad on costs both "
         "time and the activations' memory for as long as the outputs live."]
ROOT = ("The evaluation/inference code path is not wrapped in torch.no_grad() or "
        "torch.inference_mode(), and the model's parameters require grad.")


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    measured = [(g, u) for g in ctx.grads for u in [unused_graphs(g.data)] if u is not None]
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
                      "model compute among them: " + ", ".join(f"{r['name']} x{r['calls']}" for r in model_ops[:5]),
                      *(_measured_line(u) for _, u in measured)],
            where=[str(name)], root_cause=ROOT, fix=FIXES,
            inputs=[inp.path, *(g.path for g, _ in measured)],
            metrics={"forward_ops_recording": recording, "backward_functions": 0, "model_ops": model_ops,
                     "measured": [u for _, u in measured]}))
    if not out:
        for g, u in measured:
            out.append(Finding(
                rule="eval-with-grad", severity="warning",
                title=f"{u['target']} runs with autograd on and never uses the graph it builds",
                summary=_measured_line(u) + ".",
                evidence=[_measured_line(u), f"per call: {', '.join(fmt_bytes(b) for b in u['saved_bytes'])}"],
                where=[str(u["target"])], root_cause=ROOT, fix=FIXES, inputs=[g.path],
                metrics={"measured": [u]}))
    return out


RULE = Rule("eval-with-grad", "Evaluation or inference with autograd on", check)
