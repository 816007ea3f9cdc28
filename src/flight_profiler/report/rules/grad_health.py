"""grad-health: non-finite losses/gradients, exploding gradient norms, gradients accumulating
because ``zero_grad()`` is never called. Reads ``torch grads`` documents.

Root causes are named only when the evidence shows them: a watched optimizer stepping with no
zero_grad call (optimizer's or module's) in the window is the accumulation's cause; norms that
explode before turning non-finite make the explosion the non-finite values' cause.
"""

from __future__ import annotations

import math
import re
from typing import Any

from flight_profiler.report.grads import finite, num
from flight_profiler.report.models import Finding
from flight_profiler.report.rules import Context, Rule
from flight_profiler.report.thresholds import T

ZERO_GRAD_FIX = ("Call `optimizer.zero_grad()` once per step, before `loss.backward()` (or after "
                 "`optimizer.step()`); with deliberate accumulation, every k steps right after the step.")


_EXPR = re.compile(r"[A-Za-z_][\w.]*(\[\d+\])*")


def variable(name: str) -> str:
    """What a fix can write in code for a model named by its holder path: a local's expression
    in its frame (`run_style_transfer() local model` -> `model`, `main() local trainer.model` ->
    `trainer.model`), a module global's name (`__main__.target_net` -> `target_net`); `model`
    for anything else (an unreached `<DQN at 0x...>`)."""
    if " local " in name:
        expr = name.split(" local ", 1)[1]
    else:
        expr = name.rsplit(".", 1)[-1] if "." in name else name
    return expr if _EXPR.fullmatch(expr) else "model"


def _series(doc: dict[str, Any], index: int, without: set[int] | None = None) -> list[float | None]:
    """The model's total grad norm per measurement; ``without`` those layers (from the rows)."""
    if without:
        count = len(doc["models"][index].get("layers") or [])
        kept = [i for i in range(count) if i not in without]
        return [_layers_norm(m, index, kept) for m in doc["measurements"]]
    return [num(m["models"][index].get("grad_norm")) for m in doc["measurements"]]


def _first_nonfinite(doc: dict[str, Any], index: int) -> tuple[int, str, str] | None:
    """(measurement, parameter name, 'gradient'|'weight') of the first non-finite value, the
    parameters taken in module order."""
    names = [layer["name"] for layer in doc["models"][index].get("layers", [])]
    for k, m in enumerate(doc["measurements"]):
        figures = m["models"][index]
        weights = figures.get("weight_norms") or []
        for i, row in enumerate(figures.get("layers") or []):
            name = names[i] if i < len(names) else f"#{i}"
            if row is not None and (not finite(row[0]) or row[2] or row[3]):
                return k, name, "gradient"
            if i < len(weights) and weights[i] is not None and not finite(weights[i]):
                return k, name, "weight"
    return None


def _grad_scale(doc: dict[str, Any]) -> float | None:
    """The largest loss scale of an enabled AMP GradScaler seen during the measurements, if any."""
    read = (num(v) for m in doc["measurements"] for v in (m.get("grad_scales") or []))
    scales = [v for v in read if v is not None and math.isfinite(v) and v > 0]
    return max(scales) if scales else None


# A loop with no optimizer object whose backward passes ran with no zero_grad() call: it may
# still clear p.grad itself (`p.grad = None`, `p.grad.zero_()`), which no hook sees, so this is
# a suspicion that needs the norms to agree (rising, or already non-finite), not a proof.
HAND_WRITTEN_UNZEROED = "unseen"


def _zeroing(doc: dict[str, Any], index: int) -> tuple[bool | str | None, list[str]]:
    """True: zeroed; False: steps seen and no zero_grad at all; HAND_WRITTEN_UNZEROED: backward
    passes and no zero_grad call in a loop without an optimizer; None: not observed."""
    z = doc.get("zeroing") or {}
    if not z.get("observed"):
        return None, []
    opts = [o for o in doc.get("optimizers") or [] if o.get("model") == index]
    module_calls = (z.get("module_zero_grad_calls") or [0] * (index + 1))[index] if index < len(
        z.get("module_zero_grad_calls") or []) else 0
    steps = sum(int(o.get("steps") or 0) for o in opts)
    zeros = sum(int(o.get("zero_grad_calls") or 0) for o in opts) + int(module_calls or 0)
    evidence = [f"{o['class'].rsplit('.', 1)[-1]} (lr {o.get('lr')}): {o.get('steps')} step() calls, "
                f"{o.get('zero_grad_calls')} zero_grad() calls while measured" for o in opts]
    evidence.append(f"model.zero_grad() calls on the model or its submodules: {module_calls}")
    if steps >= 2 and zeros == 0:
        return False, evidence
    if zeros > 0:
        return True, evidence
    backwards = int(z.get("backward_calls") or 0)
    if not doc.get("optimizers") and backwards >= 2:
        evidence.append(f"no optimizer object (a hand-written update): {backwards} backward passes "
                        "and no zero_grad() call while measured")
        return HAND_WRITTEN_UNZEROED, evidence
    return None, evidence


def findings_for(doc: dict[str, Any], name: str) -> list[Finding]:
    out: list[Finding] = []
    for index, model in enumerate(doc["models"]):
        unstepped = _unstepped(doc, name, index, model)
        part = _unstepped_layers(doc, name, index, model)
        # The stepped layers alone are judged for accumulation and explosion: the total norm
        # grows with the unstepped ones' gradients, which nothing zeroes.
        found = _model_findings(doc, name, index, model, set(part[0].metrics["indexes"]) if part else None)
        if unstepped or (part and model.get("layers_left_out")):
            # Its norms grow because nothing zeroes what nothing uses: "accumulating, call
            # zero_grad" or "exploding, clip" would name the symptom and the wrong fix.
            found = [f for f in found if f.metrics.get("pattern") == "non-finite"]
        out.extend(unstepped + found + part)
        out.extend(_unread(doc, name, index, model))
        out.extend(_ddp_bypassed(doc, name, index, model))
    return out


def _ddp_bypassed(doc: dict[str, Any], name: str, index: int, model: dict[str, Any]) -> list[Finding]:
    """A DistributedDataParallel model whose forward was never called while its optimizer
    stepped and backward passes ran: the loop calls the module DDP wraps (`model(x)` kept from
    before the wrapping, or `ddp_model.module(x)`), so no backward all-reduces the gradients and
    each rank trains its own copy; the replicas drift apart while every loss looks fine (the
    DDP tutorial's `ToyModel` trained that way, issue 18). A one-rank group loses nothing."""
    z = doc.get("zeroing") or {}
    out: list[Finding] = []
    for d in z.get("ddp") or []:
        if not isinstance(d, dict) or d.get("model") != index or int(d.get("forward_calls") or 0):
            continue
        world = d.get("world_size")
        if isinstance(world, int) and world < 2:
            continue
        opts = [o for o in doc.get("optimizers") or [] if index in (o.get("models") or [o.get("model")])]
        steps = sum(int(o.get("steps") or 0) for o in opts)
        backwards = int(z.get("backward_calls") or 0)
        if steps < 2 or backwards < 2:
            continue
        short = variable(model["name"])
        ranks = f"{world} ranks" if isinstance(world, int) else "its ranks"
        out.append(Finding(
            rule="grad-health", severity="critical",
            title=f"{model['name']} is a DistributedDataParallel model that the loop never calls: "
                  "gradients are not synchronized",
            summary=(f"While measured, {', '.join(o['class'].rsplit('.', 1)[-1] for o in opts)} stepped "
                     f"{steps} times and {backwards} backward passes ran, but "
                     f"DistributedDataParallel.forward of {model['name']} was called 0 times: the "
                     f"loop runs the module it wraps, so no backward all-reduces the gradients and "
                     f"each of {ranks} trains its own copy."),
            evidence=[f"DistributedDataParallel.forward calls of {model['name']} while measured: 0",
                      f"optimizer steps on its parameters: {steps}; backward passes: {backwards}",
                      *([f"process group: {world} ranks"] if isinstance(world, int) else [])],
            where=[f"{model['name']} ({model['class']}, {model['numel']:,} parameters)",
                   *([f"measured after each call of {doc['target']}"] if doc.get("target") else [])],
            root_cause=("DDP synchronizes gradients only for the forward passes that go through the "
                        "wrapper (it prepares its reducer there, and the reducer's hooks all-reduce "
                        "in the backward). Calling the wrapped module directly (the `model` kept from "
                        "before `DDP(model)`, or `ddp_model.module(x)`) trains each rank's replica on "
                        "its own shard: the replicas drift apart and the result is not data-parallel "
                        "training, with no error and plausible losses."),
            fix=[f"Call the wrapper in the training loop: `outputs = {short}(inputs)`, not the module "
                 "it wraps; use `.module` only to save or load weights "
                 f"(`{short}.module.state_dict()`).",
                 "To skip synchronization on purpose during gradient accumulation, call the "
                 f"wrapper inside `with {short}.no_sync():`."],
            inputs=[name],
            metrics={"pattern": "ddp-bypassed", "model": model["name"], "steps": steps,
                     "backward_calls": backwards, "world_size": world}))
    return out


def _stepped_models(doc: dict[str, Any]) -> set[int]:
    """Indexes of the models an optimizer holds parameters of (``models``; older documents
    name only the optimizer's main ``model``)."""
    out: set[int] = set()
    for o in doc.get("optimizers") or []:
        held = o.get("models")
        out.update(held if isinstance(held, list) else [o.get("model")] if o.get("model") is not None else [])
    return out


def _trained_unzeroed(doc: dict[str, Any], index: int) -> bool:
    """Optimizers watched while training ran (2 steps or backward passes) and no
    model.zero_grad() reached this model: what an optimizer's own zero_grad() does not clear
    added up meanwhile."""
    z = doc.get("zeroing") or {}
    opts = doc.get("optimizers") or []
    if not z.get("observed") or not opts:
        return False
    if sum(int(o.get("steps") or 0) for o in opts) < 2 and int(z.get("backward_calls") or 0) < 2:
        return False
    calls = z.get("module_zero_grad_calls") or []
    return not (index < len(calls) and int(calls[index] or 0) > 0)


def _unstepped(doc: dict[str, Any], name: str, index: int, model: dict[str, Any]) -> list[Finding]:
    """Gradients written into a model that no optimizer steps and nothing zeroes: a target
    network, a teacher or a frozen encoder whose forward ran with autograd on (the DQN
    tutorial's target net without `torch.no_grad()`). Every backward adds to its .grad: wasted
    backward compute, a .grad as big as the model, norms that grow without bound.

    Proof, not a guess: optimizers are watched and step (so training goes through them), none
    holds this model's parameters, no zero_grad() reached it while measured, backward passes ran,
    and its gradient norm changed between measurements (grads written now, not left from an
    earlier phase of the program)."""
    if index in _stepped_models(doc) or not _trained_unzeroed(doc, index):
        return []
    z = doc["zeroing"]
    opts = doc["optimizers"]
    norms = [v for v in _series(doc, index) if v is not None]
    if len(norms) < 2 or not any(b != a for a, b in zip(norms, norms[1:])):
        return []
    shown = ", ".join(_fmt(v) for v in _series(doc, index))
    short = variable(model["name"])
    backwards = z.get("backward_calls")
    return [Finding(
        rule="grad-health", severity="warning",
        title=f"backward() writes gradients into {model['name']}, which no optimizer steps",
        summary=(f"No optimizer holds the parameters of {model['name']} and nothing zeroes them, yet "
                 f"its gradients change at every measurement ({shown}): its forward runs with "
                 "autograd on inside the loss, so every backward() also runs through it."),
        evidence=[f"grad norm per measurement: {shown}",
                  f"optimizers watched: {', '.join(o['class'].rsplit('.', 1)[-1] for o in opts)}; "
                  f"none holds a parameter of {short}",
                  f"backward passes while measured: {backwards}; zero_grad() calls reaching "
                  f"{short}: 0"],
        where=[f"{model['name']} ({model['class']}, {model['numel']:,} parameters)",
               *([f"measured after each call of {doc['target']}"] if doc.get("target") else [])],
        root_cause=("The network's output feeds the loss with autograd on (a target network, a "
                    "teacher, a frozen encoder): backward() computes gradients for all of its "
                    "parameters, which no optimizer uses and nothing clears, so they add up step "
                    "after step (wasted backward compute, a .grad as big as the model, norms "
                    "growing without bound)."),
        fix=[f"Run {short}'s forward under `with torch.no_grad():` (or `.detach()` its output) "
             "where it only provides targets.",
             f"If it never trains, freeze it once: `{short}.requires_grad_(False)`."],
        inputs=[name],
        metrics={"pattern": "unstepped-grads", "model": model["name"], "grad_norms": norms,
                 "backward_calls": backwards})]


def _layers_norm(measurement: dict[str, Any], index: int, layers: list[int]) -> float | None:
    """The L2 norm over ``layers``' gradients at one measurement (None: none has a gradient)."""
    rows = measurement["models"][index].get("layers") or []
    norms = [num(rows[i][0]) for i in layers if i < len(rows) and isinstance(rows[i], list) and rows[i]]
    found = [v for v in norms if v is not None]
    return math.sqrt(sum(v * v for v in found)) if found else None


def _unstepped_layers(doc: dict[str, Any], name: str, index: int, model: dict[str, Any]) -> list[Finding]:
    """Parameters of a model an optimizer steps that no optimizer holds, whose gradients
    backward() writes: the fine-tuning tutorial's "fixed feature extractor" with its freezing
    loop left out (the optimizer gets `model.fc.parameters()`, the backbone keeps
    requires_grad). Each backward computes the backbone's gradients for nothing and, since the
    optimizer's zero_grad() clears only its own parameters, adds them up without bound.

    Proof as for a whole unstepped model: watched optimizers step, none holds these parameters,
    no model.zero_grad() reached this model, backward passes ran, and the gradients of those
    parameters changed between measurements (written now)."""
    layers = [i for i in model.get("unstepped_layers") or [] if isinstance(i, int) and i >= 0]
    if not layers or not _trained_unzeroed(doc, index):
        return []
    z = doc["zeroing"]
    opts = doc["optimizers"]
    series = [_layers_norm(m, index, layers) for m in doc["measurements"]]
    norms = [v for v in series if v is not None]
    if len(norms) < 2 or not any(b != a for a, b in zip(norms, norms[1:])):
        return []
    described = model.get("layers") or []
    names = [str(described[i].get("name")) for i in layers if i < len(described)]
    numel = sum(int(described[i].get("numel") or 0) for i in layers if i < len(described))
    share = 100.0 * numel / model["numel"] if model.get("numel") else None
    short = variable(model["name"])
    unstepped = set(layers)
    stepped = sorted({str(layer.get("name")).rsplit(".", 1)[0]
                      for j, layer in enumerate(described) if j not in unstepped})
    shown = ", ".join(_fmt(v) for v in series)
    listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return [Finding(
        rule="grad-health", severity="warning",
        title=f"backward() writes gradients into {len(layers)} parameter tensors of {model['name']} "
              "that no optimizer steps",
        summary=(f"The optimizers step only part of {model['name']} ({', '.join(stepped[:4]) or 'some layers'}); "
                 f"{len(layers)} of its parameter tensors ({numel:,} values"
                 + ("" if share is None else ", nearly all of the model" if share >= 99.5
                    else f", {share:.0f}% of the model")
                 + f") still require grad, so every backward() computes their gradients, which nothing "
                 f"uses and the optimizers' zero_grad() does not clear: their norm went {shown}."),
        evidence=[f"grad norm of the unstepped parameters per measurement: {shown}",
                  f"unstepped parameters: {listed}",
                  f"optimizers watched: {', '.join(o['class'].rsplit('.', 1)[-1] for o in opts)}; "
                  f"none holds those parameters",
                  f"backward passes while measured: {z.get('backward_calls')}; "
                  f"{short}.zero_grad() calls: 0"],
        where=[f"{model['name']} ({model['class']}, {model['numel']:,} parameters)",
               *(f"parameter {n}" for n in names[:6]),
               *([f"measured after each call of {doc['target']}"] if doc.get("target") else [])],
        root_cause=("The optimizer was given only some of the model's parameters (a new head, "
                    "`model.fc.parameters()`) while the rest still require grad: backward() "
                    "computes gradients for all of them (the backbone's backward compute and a "
                    ".grad as big as it, for nothing), and since the optimizer zeroes only its own "
                    "parameters, those gradients add up step after step."),
        fix=[f"Freeze what should not train before building the optimizer: `for param in "
             f"{short}.parameters(): param.requires_grad = False`, then replace the head (new "
             "layers require grad), or `layer.requires_grad_(False)` on the frozen part.",
             "If those layers should train, give their parameters to the optimizer "
             f"(`optim.SGD({short}.parameters(), ...)`)."],
        inputs=[name],
        metrics={"pattern": "unstepped-layers", "model": model["name"], "layers": names, "indexes": layers,
                 "numel": numel, "grad_norms": norms, "backward_calls": z.get("backward_calls")})]


def _unread(doc: dict[str, Any], name: str, index: int, model: dict[str, Any]) -> list[Finding]:
    """Parameters the agent could not read (meta or fake tensors, a dtype it cannot reduce): a
    quiet verdict must not read as "gradients healthy" over what was never seen."""
    counts = [int(m["models"][index].get("unreadable") or 0) for m in doc["measurements"]]
    if not counts or max(counts) == 0:
        return []
    unreadable = max(counts)
    total = unreadable + max(int(m["models"][index].get("with_grad") or 0)
                             + int(m["models"][index].get("without_grad") or 0)
                             for m in doc["measurements"])
    return [Finding(
        rule="grad-health", severity="info",
        title=f"{unreadable} of {total} parameter tensors of {model['name']} could not be read",
        summary=(f"{unreadable} of {total} parameter tensors could not be measured (meta or fake "
                 "tensors, or a dtype the measurement cannot reduce): their gradients and weights "
                 "are not judged" + (", so nothing of this model is." if unreadable == total else ".")),
        evidence=[f"unreadable parameter tensors per measurement: {counts}"],
        where=[f"{model['name']} ({model['class']}, {model['numel']:,} parameters)"],
        fix=["Nothing to fix in the job; gradients of those tensors can be checked by hand "
             "(`torch.isfinite(p.grad).all()` in the loop)."],
        root_cause="Missing evidence, not a problem found.", inputs=[name],
        metrics={"pattern": "unreadable", "model": model["name"], "unreadable": unreadable,
                 "params": total})]


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.4g}"


def _model_findings(doc: dict[str, Any], name: str, index: int, model: dict[str, Any],
                    without: set[int] | None = None) -> list[Finding]:
    out: list[Finding] = []
    norms = _series(doc, index, without)
    shown = ", ".join(_fmt(v) for v in norms)
    where = [f"{model['name']} ({model['class']}, {model['numel']:,} parameters)"]
    if doc.get("target"):
        where.append(f"measured after each call of {doc['target']}")
    zeroed, zero_evidence = _zeroing(doc, index)
    good = [v for v in norms if v is not None and math.isfinite(v)]
    rising = len(good) == len(norms) and len(good) >= T.grad_accumulation_min_points and all(
        b > a for a, b in zip(good, good[1:]))
    # Accumulated grads grow about linearly with the steps since the last zeroing; explosions
    # multiply. Unobserved, only growth short of the explosion ratio reads as accumulation.
    # With an enabled GradScaler, a norm read between backward() and unscale_ is the true one
    # times the scale (65536 to start) and one read after it is not: neither their ratios nor their
    # rise mean anything, and only a norm past the line times the scale is an explosion.
    scale = _grad_scale(doc)
    surging = scale is None and bool(good) and good[0] > 0 and max(good) / good[0] >= T.grad_norm_growth_ratio
    first = _first_nonfinite(doc, index)
    unzeroed = zeroed == HAND_WRITTEN_UNZEROED and (rising or first is not None)
    accumulating = zeroed is False or unzeroed or (
        zeroed is None and scale is None and rising and not surging
        and good[0] > 0 and good[-1] >= T.grad_accumulation_ratio * good[0])
    exploding = bool(good) and (max(good) >= T.grad_norm_exploding * (scale or 1.0) or surging)
    scaled_note = ([f"an enabled AMP GradScaler (scale up to {scale:g}) multiplies gradients until "
                    "unscale_: norms are shown as read, and judged against the line times the scale"]
                   if scale is not None else [])
    if accumulating:
        cause = ("optimizer.step() runs but zero_grad() is never called (neither the optimizer's nor "
                 "the model's): every backward() adds to the previous gradients, so the update grows "
                 "each step" if zeroed is False else
                 "backward() runs step after step and zero_grad() is never called: unless the loop "
                 "clears p.grad itself, every backward() adds to the previous gradients, and a "
                 "hand-written update (`p.data.add_(p.grad, alpha=-lr)`) grows with them"
                 + (" until they overflowed" if first is not None else "") if unzeroed else
                 "gradient norms only grow from one step to the next, as when zero_grad() is not called "
                 "between steps (not observed directly: measure a method to see the calls)")
        out.append(Finding(
            rule="grad-health",
            severity="critical" if zeroed is False or (unzeroed and first is not None) else "warning",
            title=f"gradients of {model['name']} accumulate across steps (zero_grad not called)",
            summary=f"Gradient norm over {len(norms)} measurements: {shown}.",
            evidence=[f"grad norm per measurement: {shown}", *zero_evidence, *scaled_note],
            where=where, root_cause=cause,
            fix=([f"Call `{variable(model['name'])}.zero_grad()` at the start of each "
                  "step, before the forward (the loop has no optimizer: the model's own), or "
                  "clear each `p.grad` after the update."] if unzeroed else
                 [ZERO_GRAD_FIX, "Or `model.zero_grad(set_to_none=True)` at the start of each step."]),
            inputs=[name], metrics={"pattern": "grads-accumulating", "model": model["name"],
                                    "grad_norms": norms, "zero_grad_observed": zeroed is not None}))
    if exploding and not accumulating:
        out.append(Finding(
            rule="grad-health", severity="warning",
            title=f"gradient norm of {model['name']} explodes (max {_fmt(max(good))})",
            summary=f"Total gradient norm (as clip_grad_norm_ computes it): {shown}.",
            evidence=[f"grad norm per measurement: {shown}",
                      f"thresholds: >= {T.grad_norm_exploding:g}, or x{T.grad_norm_growth_ratio:g} within the window",
                      *scaled_note],
            where=where, root_cause="Updates scale with the gradient: too high a learning rate, no clipping, "
                                    "or unnormalised inputs/targets make it grow step after step.",
            fix=["Clip: `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)` between "
                 "`backward()` and `step()`.", "Lower the learning rate (or add warm-up).",
                 "Normalise inputs and targets; check the loss scale (AMP: use GradScaler)."],
            inputs=[name], metrics={"pattern": "exploding", "model": model["name"], "grad_norms": norms}))
    if first is not None:
        k, layer, what = first
        if accumulating:
            cause = "gradients accumulated without zero_grad() until they overflowed (see the accumulation finding)"
        elif exploding:
            cause = "the gradient norm exploded before the values overflowed"
        else:
            cause = (f"the first non-finite {what} is in {layer} (module order); upstream of it the values were "
                     "finite: a NaN/Inf input, a log/sqrt/div of zero or negative values, or an overflow in "
                     "low precision there")
        # An enabled GradScaler finds overflowed gradients itself, skips that step and lowers its
        # scale: a transient Inf/NaN gradient is how AMP works, not a fault; weights are.
        overflow_skipped = scale is not None and what == "gradient" and not accumulating and not exploding
        if overflow_skipped:
            cause = ("an enabled GradScaler skips a step whose scaled gradients overflow and lowers its "
                     "scale; this is a fault only if it keeps happening (the scale collapsing) or reaches "
                     "the weights")
        anomaly = (doc.get("anomaly") or {}).get("first")
        found_by_anomaly = []
        if isinstance(anomaly, dict):
            op = f"{anomaly.get('op')} in {anomaly.get('phase')}" + (
                f" ({anomaly['backward_node']})" if anomaly.get("backward_node") else "")
            stack = [str(line) for line in anomaly.get("forward_stack") or []]
            found_by_anomaly = [f"first NaN/Inf made by {op} (torch anomaly)",
                                *(f"  {line}" for line in stack[-4:])]
            if stack:
                where = [*where, f"forward call: {stack[-1]}"]
        out.append(Finding(
            rule="grad-health", severity="info" if overflow_skipped else "critical",
            title=f"non-finite {what}s in {model['name']}, first in {layer}",
            summary=(f"Measurement {k + 1} of {len(norms)}: the first parameter (in module order) with a "
                     f"NaN/Inf {what} is {layer}. Gradient norms: {shown}."),
            evidence=[f"grad norm per measurement: {shown}",
                      *(f"measurement {j + 1}: {m['models'][index].get('nonfinite_grad_layers', 0)} layers with "
                        f"non-finite grads, {m['models'][index].get('nonfinite_weight_layers', 0)} with non-finite "
                        "weights" for j, m in enumerate(doc["measurements"]))][:8] + found_by_anomaly + scaled_note,
            where=[*where, f"parameter {layer}"], root_cause=cause,
            fix=[*([ZERO_GRAD_FIX] if accumulating else []),
                 "Find the operation: `flight_profiler PID --cmd \"torch anomaly MODULE [CLASS] METHOD -n 1\"` "
                 "names the forward op and Python line that produced the first NaN.",
                 "Guard the step: skip it when `not torch.isfinite(loss)`; clip gradients; lower the learning rate."],
            inputs=[name], metrics={"pattern": "non-finite", "model": model["name"], "first_layer": layer,
                                    "first_measurement": k, "what": what}))
    return out


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for inp in ctx.grads:
        out.extend(findings_for(inp.data, inp.path))
    return out


RULE = Rule("grad-health", "Non-finite, exploding or accumulating gradients", check)
