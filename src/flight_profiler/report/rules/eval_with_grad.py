"""eval-with-grad: a forward that builds an autograd graph no backward ever uses (evaluation or
inference with grad mode on).

Evidence, from a profile with steps (report/steps.py): forward operators of a model (matmul,
linear, convolution, lstm, attention ...) record an autograd sequence number when they build a
graph node (ops under ``torch.no_grad()`` / ``torch.inference_mode()`` record none), and each
backward function carries the number of the node it runs for. A node built in a whole step whose
number no backward ran is a graph nobody used; judged over the whole steps (but the last: its
graph may be used by the next step's backward), so that a training forward, whose backward runs
after it returns, is never counted. That finds the evaluation pass of a training loop (the
prediction after an LBFGS step without no_grad) as well as an inference service.

Without steps (a window with no optimizer step, backward or marked call): the window must hold
model operators recorded with grad on and not one backward function.

Evidence, from `torch grads METHOD` (live, per call): every measured call ran with grad mode on,
saved tensors for backward and no backward read any of them, during the call or after it until
the first backward pass that ended after the last call (the agent waits for one). Alone, that
is evidence where such a backward came, or where nothing trains (live_evidence): a forward's
graph is used by the backward after it returns.
"""

from __future__ import annotations

from typing import Any

from flight_profiler.report import trace_loader
from flight_profiler.report.models import Finding, InputResult
from flight_profiler.report.rules import Context, Rule, label
from flight_profiler.report.thresholds import T
from flight_profiler.report.units import fmt_bytes

MODEL_OPS = trace_loader.MODEL_OPS
# Graph nodes built and never used, per judged step, from which a profile with steps is a finding.
UNUSED_PER_STEP = 1.0
# Separate runs of unused nodes per judged step from which, all of them short, the unused nodes
# are outputs a trained forward computes and drops (10 a step in the character RNN), not a pass.
SCATTERED_RUNS_PER_STEP = 3

def unused_graphs(doc: dict[str, Any]) -> dict[str, Any] | None:
    """From a `torch grads METHOD` document: calls that built graphs no backward used, or None."""
    costs = [m.get("autograd") for m in doc.get("measurements") or []]
    if not costs or any(not isinstance(c, dict) for c in costs):
        return None
    if all(c.get("grad_enabled") and int(c.get("saved_bytes") or 0) > 0 and not c.get("unpacked")
           and not c.get("unpacked_after") for c in costs):
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


def _trains(doc: dict[str, Any]) -> bool:
    """An optimizer stepped while `torch grads` measured: the method's graphs are used later."""
    return any(int(o.get("steps") or 0) > 0 for o in doc.get("optimizers") or [])


def live_evidence(doc: dict[str, Any]) -> dict[str, Any] | None:
    """unused_graphs, where it is evidence on its own: a backward pass ended after the measured
    calls and read none of their graphs (``unpacked_after``), or nothing trains. A forward's
    graph is read by the backward after it returns: calls of a method called many times a step
    (a character RNN's forward) are all in before that backward, and where no backward came
    while the agent waited (newer documents) in a program that has an optimizer, or an optimizer
    stepped meanwhile (older ones), nothing was seen either way."""
    unused = unused_graphs(doc)
    if unused is None:
        return None
    zeroing = doc.get("zeroing") or {}
    if zeroing.get("backward_after_calls"):
        return unused
    if _trains(doc) or ("backward_after_calls" in zeroing and doc.get("optimizers")):
        return None
    return unused


def _from_steps(inp: InputResult, ag: dict[str, Any], measured: list[tuple[InputResult, dict[str, Any]]],
                ) -> Finding | None:
    unused = int(ag.get("unused_nodes") or 0)
    # Per step, or one whole pass in a row: a validation pass once an epoch is diluted by the
    # epoch's training steps far below one node a step (0.7 on a DDP trainer's rank 0).
    longest = int(ag.get("longest_unused_run") or 0)
    if unused < T.eval_grad_min_ops or (float(ag.get("unused_per_step") or 0.0) < UNUSED_PER_STEP
                                        and longest < T.eval_grad_min_ops):
        return None
    # Short unused runs scattered between used nodes, several a step: a trained forward that
    # computes an output it drops (the character RNN's output at every character but the last),
    # not an evaluation pass, which is one run of whole forwards.
    judged = int(ag.get("judged_steps") or 0)
    runs = int(ag.get("unused_runs") or 0)
    if longest < T.eval_grad_min_ops and judged and runs >= SCATTERED_RUNS_PER_STEP * judged:
        return None
    step = inp.data.get("step") or {}
    places = ag.get("unused_where") or []
    where = [f"{p['where']} ({p['share']:.0%} of them)" for p in places] or [str(label(inp))]
    ops = ", ".join(f"{o['name']} x{o['calls']}" for o in ag.get("unused_ops") or [])
    return Finding(
        rule="eval-with-grad", severity="warning",
        title="a forward pass runs with autograd on and no backward uses its graph",
        summary=(f"{label(inp)}: over {ag['judged_steps']} whole steps ({step.get('name')}), "
                 f"{unused} of the {ag['model_nodes']} graph nodes the model's operators built were "
                 "used by no backward: that forward keeps its activations alive for a backward "
                 "that never comes, and pays autograd's cost for nothing."),
        evidence=[f"graph nodes built by model operators in {ag['judged_steps']} whole steps: "
                  f"{ag['model_nodes']}, used by no backward: {unused} ({ag['unused_per_step']} per step, "
                  f"up to {ag.get('longest_unused_run', 0)} built in a row)",
                  f"operators whose nodes were never used: {ops}",
                  f"the step: {step.get('how')}",
                  *(_measured_line(u) for _, u in measured)],
        where=where, root_cause=ROOT, fix=FIXES,
        inputs=[inp.path, *(g.path for g, _ in measured)],
        metrics={"forward_ops_recording": int(ag.get("forward_ops_recording") or 0),
                 "unused_nodes": unused, "model_nodes": ag["model_nodes"],
                 "longest_unused_run": int(ag.get("longest_unused_run") or 0),
                 "backward_functions": int(ag.get("backward_functions") or 0),
                 "measured": [u for _, u in measured]})


def _without_steps(inp: InputResult, ag: dict[str, Any], measured: list[tuple[InputResult, dict[str, Any]]],
                   ) -> Finding | None:
    recording = int(ag.get("forward_ops_recording") or 0)
    if recording < T.eval_grad_min_ops or int(ag.get("backward_functions") or 0) > 0:
        return None
    if (inp.data.get("step") or {}).get("region"):
        return None  # a method's calls alone: its backward may run after it returns
    top = ag.get("top_recording_ops") or []
    model_ops = [r for r in top if trace_loader.is_model_op(str(r.get("name", "")))]
    if not model_ops:
        return None
    name = inp.data.get("trace_name") or label(inp)
    return Finding(
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
                 "measured": [u for _, u in measured]})


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    measured = [(g, u) for g in ctx.grads for u in [unused_graphs(g.data)] if u is not None]
    alone = [(g, u) for g in ctx.grads for u in [live_evidence(g.data)] if u is not None]
    judged = False
    for inp in ctx.traces:
        ag = inp.data.get("autograd") or {}
        found = _from_steps(inp, ag, measured) if "unused_nodes" in ag else None
        judged = judged or "unused_nodes" in ag or int(ag.get("backward_functions") or 0) > 0
        if found is None:  # a window with no backward at all: an inference loop
            found = _without_steps(inp, ag, measured)
        if found is not None:
            out.append(found)
    # The live calls alone: only where no profile saw graphs used, and where they are evidence.
    if not out and not judged:
        for g, u in alone:
            out.append(Finding(
                rule="eval-with-grad", severity="warning",
                title=f"{u['target']} runs with autograd on and never uses the graph it builds",
                summary=_measured_line(u) + ".",
                evidence=[_measured_line(u), f"per call: {', '.join(fmt_bytes(b) for b in u['saved_bytes'])}"],
                where=[str(u["target"])], root_cause=ROOT, fix=FIXES, inputs=[g.path],
                metrics={"measured": [u]}))
    return out


RULE = Rule("eval-with-grad", "Evaluation or inference with autograd on", check)
