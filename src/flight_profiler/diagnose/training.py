"""The training-health phase of diagnose: `torch grads`, and `torch anomaly` when it finds NaNs.

With a method that is being called: gradients measured right after its next calls (at least
3, so that growth shows), with optimizer step()/zero_grad() counted meanwhile; without one,
3 measurements 1 s apart at the main thread's safe point. When a model has non-finite values
and a method is known, one call runs under `torch anomaly` to name the op and the line that made
the first NaN (one call: anomaly mode is costly and process-wide). A target with no trainable
model skips the phase. The grads file joins the report's inputs (rule grad-health).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flight_profiler.atomic_files import write_text_atomic
from flight_profiler.diagnose.run import Run, Skip, expect_file
from flight_profiler.errors import FlightProfilerError
from flight_profiler.requests import torch as torch_requests

if TYPE_CHECKING:
    from flight_profiler.diagnose.model import PhaseResult

GRAD_CALLS_MIN = 3


def phase_grads(run: Run, phase: PhaseResult) -> None:
    run.require_torch()
    o = run.options
    path = run.path("grads.json")
    method = o.target is not None and bool(run.method_called)
    # A costly call (a whole LBFGS step) gets the least that shows growth, like record and trace.
    calls = max(GRAD_CALLS_MIN, min(run.calls_for(GRAD_CALLS_MIN), 5))
    try:
        if method:
            assert o.target is not None
            request = torch_requests.grads(run.words(), calls=calls, file=path, timeout=o.timeout)
            result = run.command(phase, request, expect_calls=calls)
        else:
            request = torch_requests.grads(calls=GRAD_CALLS_MIN, interval=1.0, file=path)
            result = run.command(phase, request, timeout=GRAD_CALLS_MIN + o.timeout)
    except FlightProfilerError as exc:
        if "no model with trainable parameters" in exc.message:
            raise Skip("no model with trainable parameters in the target") from None
        raise
    expect_file(phase, path)
    phase.data["models"] = [_model_line(result, i) for i in range(len(result.get("models") or []))][:5]
    if method and _nonfinite(result):
        _anomaly(run, phase)
        first = (phase.data.get("anomaly") or {}).get("first")
        if first:
            _attach_anomaly(path, first)


def _model_line(result: dict[str, Any], index: int) -> dict[str, Any]:
    model = result["models"][index]
    norms = [m["models"][index].get("grad_norm") for m in result.get("measurements") or []]
    return {"name": model.get("name"), "parameters": model.get("numel"), "grad_norms": norms}


def _nonfinite(result: dict[str, Any]) -> bool:
    return any(int(f.get("nonfinite_grad_layers") or 0) or int(f.get("nonfinite_weight_layers") or 0)
               for m in result.get("measurements") or [] for f in m.get("models") or [])


def _attach_anomaly(path: str, first: dict[str, Any]) -> None:
    """Put the anomaly's answer into the grads file, where the grad-health rule reads it."""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["anomaly"] = {"first": first}
    write_text_atomic(path, json.dumps(doc))


def _anomaly(run: Run, phase: PhaseResult) -> None:
    o = run.options
    assert o.target is not None
    request = torch_requests.anomaly(run.words(), calls=1, timeout=o.timeout)
    grads_command = phase.command
    try:
        result = run.command(phase, request, expect_calls=1)
    except FlightProfilerError as exc:
        phase.data["anomaly"] = {"error": exc.message}
        return
    finally:
        # Both lines are what a user would re-run; the phase shows them together.
        phase.command = f"{grads_command}; {request.line}" if grads_command else request.line
    phase.data["anomaly"] = {"first": result.get("first"), "restored": result.get("anomaly_after")
                             == result.get("anomaly_before")}
