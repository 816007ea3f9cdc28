"""The training-health phase of diagnose: `torch grads`, and `torch anomaly` when it finds NaNs.

With a method that is being called: gradients measured right after its next calls (at least
3, so that growth shows), with optimizer step()/zero_grad() counted meanwhile; without one,
right after the next calls of the optimizer step the profile window found (workflow
._window_step), else 3 measurements 1 s apart at the main thread's safe point. When a model has non-finite values
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
    calls = run.calls_within(max(GRAD_CALLS_MIN, min(run.calls_for(GRAD_CALLS_MIN), 5)))
    try:
        if method:
            assert o.target is not None
            request = torch_requests.grads(run.words(), calls=calls, file=path, timeout=o.timeout)
            result = run.command(phase, request, expect_calls=calls)
        elif run.window_step is not None:
            result = _after_window_steps(run, phase, path)
        else:
            result = _snapshots(run, phase, path)
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


def _snapshots(run: Run, phase: PhaseResult, path: str) -> dict[str, Any]:
    request = torch_requests.grads(calls=GRAD_CALLS_MIN, interval=1.0, file=path)
    return run.command(phase, request, timeout=GRAD_CALLS_MIN + run.options.timeout)


# How long the window step's calls are waited for, in its own periods (the window's rate), and
# at least: a step that slowed down or stopped (an epoch's validation) falls back to snapshots.
STEP_WAIT_PERIODS = 10.0
STEP_WAIT_MIN_S = 3.0


def _after_window_steps(run: Run, phase: PhaseResult, path: str) -> dict[str, Any]:
    assert run.window_step is not None
    rate = run.window_steps_per_s or 1.0
    wait = min(run.options.timeout, max(STEP_WAIT_MIN_S, STEP_WAIT_PERIODS * GRAD_CALLS_MIN / rate))
    request = torch_requests.grads(run.window_step, calls=GRAD_CALLS_MIN, file=path, timeout=wait)
    try:
        result = run.command(phase, request)
    except FlightProfilerError as exc:
        if "no model with trainable parameters" in exc.message:
            raise
        phase.data["window_step"] = f"{' '.join(run.window_step)}: {exc.message}; measured at safe points instead"
        return _snapshots(run, phase, path)
    if int(result.get("calls_recorded") or len(result.get("measurements") or [])) < 2:
        phase.data["window_step"] = (f"{' '.join(run.window_step)}: fewer than 2 calls within "
                                     f"{wait:g}s; measured at safe points instead")
        return _snapshots(run, phase, path)
    phase.data["window_step"] = f"measured after the calls of {' '.join(run.window_step)}"
    return result


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
