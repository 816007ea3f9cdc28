"""`torch grads` and `torch anomaly`: how the training-health answers are shown.

Kept apart from torch.py (memory/tensors/profile) so each module stays one concept and small.
The verdicts shown under `torch grads` are the report's grad-health rule run on the same
document, so the live command and `flight_profiler report grads.json` always agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flight_profiler.cli.agent_commands.base import fmt, txt
from flight_profiler.cli.agent_commands.torch import _file_line

if TYPE_CHECKING:
    from rich.console import Console

ROWS = 12


def _g(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return txt(v, 40)
    return fmt(v, ".3g")


def render_grads(data: dict[str, Any], console: Console) -> None:
    from rich.table import Column, Table

    from flight_profiler.report.grads import check_grads
    from flight_profiler.report.rules.grad_health import findings_for

    _file_line(data, console, "gradient health")
    measurements = data.get("measurements") or []
    where = f"after each of {len(measurements)} calls of {txt(data['target'])}" if data.get("target") else \
        f"{len(measurements)} measurement(s) at the main thread's safe point"
    console.print(f"measured {where}", highlight=False)
    for index, model in enumerate(data.get("models") or []):
        series = [m["models"][index] for m in measurements if index < len(m["models"])]
        last = series[-1] if series else {}
        console.print(f"[bold]{txt(model['name'], 200)}[/bold] ({txt(model['class'], 200)}, "
                      f"{fmt(model['numel'], ',')} parameters in {fmt(model['params'], 'd')} tensors): "
                      "grad norm " + " -> ".join(_g(s.get("grad_norm")) for s in series)
                      + f", weight norm {_g(last.get('weight_norm'))}, measured in "
                      f"{_g(last.get('elapsed_s'))} s", highlight=False)
        if index >= 3:
            continue  # the biggest models first; the file has them all
        t = Table(Column("parameter", overflow="fold"), "shape", "grad norm", "max |grad|", "NaN", "Inf", "weight norm")
        layers = model.get("layers") or []
        rows = last.get("layers") or []
        weight_norms = last.get("weight_norms") or []
        for i, layer in enumerate(layers[:ROWS]):
            row = rows[i] if i < len(rows) else None
            cells = ["(no grad)", "-", "-", "-"] if row is None else [_g(row[0]), _g(row[1]), _g(row[2]), _g(row[3])]
            wn = weight_norms[i] if i < len(weight_norms) else None
            t.add_row(txt(layer["name"], 400), str(tuple(layer["shape"])), *cells, _g(wn))
        if len(layers) > ROWS:
            t.add_row(f"... {len(layers) - ROWS} more in the file", "", "", "", "", "", "")
        console.print(t)
    for o in data.get("optimizers") or []:
        if o.get("steps") is not None:
            console.print(f"{txt(o['class'], 200)} (lr {txt(o.get('lr'), 40)}): {fmt(o['steps'], 'd')} step(), "
                          f"{fmt(o.get('zero_grad_calls'), 'd')} zero_grad() calls while measured",
                          highlight=False)
    if not (data.get("zeroing") or {}).get("observed"):
        console.print("[dim]zero_grad() calls are counted when measuring a method or -n > 1[/dim]")
    try:
        findings = findings_for(check_grads(data), data.get("path") or "torch grads")
    except ValueError:
        findings = []
    for f in findings:
        colour = {"critical": "red", "warning": "yellow"}.get(f.severity, "cyan")
        console.print(f"[{colour}]{f.severity}:[/{colour}] {txt(f.title)}", highlight=False)
        if f.root_cause:
            console.print(f"  cause: {txt(f.root_cause)}", highlight=False)
        for fix in f.fix[:2]:
            console.print(f"  fix: {txt(fix)}", highlight=False)
    from flight_profiler.report.rules.eval_with_grad import live_evidence
    from flight_profiler.report.units import fmt_bytes

    unused = live_evidence(data)
    if unused:
        mean = sum(unused["saved_bytes"]) / len(unused["saved_bytes"])
        console.print(f"[yellow]warning:[/yellow] every measured call ran with autograd on and saved "
                      f"{fmt_bytes(mean)} of activations that no backward read: evaluation with grad on")
        console.print("  fix: wrap it in `with torch.inference_mode():` (or `torch.no_grad()`)")
    elif not [f for f in findings if f.severity != "info"] and measurements:
        read = sum(int(f.get("with_grad") or 0) for m in measurements for f in m.get("models") or [])
        if read:
            zeroing = ("zeroed between steps" if (data.get("zeroing") or {}).get("observed")
                       else "zeroing not observed")
            console.print(f"[green]gradients finite, not exploding; {zeroing}[/green]")
        else:
            console.print("[dim]no gradient was there to read at the measured moments: nothing "
                          "judged (measure right after the backward: a method that runs it)[/dim]")


def render_anomaly(data: dict[str, Any], console: Console) -> None:
    console.print(f"ran {fmt(data.get('calls_recorded'), 'd')} of {fmt(data.get('calls_requested'), 'd')} "
                  f"call(s) of {txt(data.get('target'))} under anomaly detection "
                  f"({fmt(data.get('ops_checked', 0), 'd')} operators checked; call times "
                  + ", ".join(f"{s:.3f} s" for s in data.get("call_seconds") or []) + ")",
                  highlight=False)
    first = data.get("first")
    if first:
        where = f"in backward ({txt(first.get('backward_node'), 200)}, made by the forward call below)" \
            if first["phase"] == "backward" else "in forward"
        console.print(f"[red]first non-finite value:[/red] {txt(first['op'], 200)} {where}, call "
                      f"{fmt(first['call'] + 1, 'd')}: {fmt(first['nan'], 'd')} NaN, {fmt(first['inf'], 'd')} "
                      f"Inf in a {txt(first['dtype'], 40)} {tuple(first['shape'])} output", highlight=False)
        origin = data.get("origin")
        if not first.get("inputs_finite") and not origin:
            console.print("  [yellow]its inputs were already non-finite: they came from outside the autograd "
                          "ops seen (data, a parameter, a buffer)[/yellow]")
        for line in first.get("forward_stack") or ["(no Python frame of the program: called from torch internals)"]:
            console.print(f"  {txt(line)}", highlight=False)
        if origin and origin is not first and origin != first:
            console.print(f"[red]the first op that made one out of finite inputs:[/red] {txt(origin['op'], 200)} "
                          f"in {txt(origin['phase'], 20)}, call {fmt(origin['call'] + 1, 'd')}", highlight=False)
            for line in origin.get("forward_stack") or []:
                console.print(f"  {txt(line)}", highlight=False)
    elif data.get("note"):
        console.print(txt(data["note"]), highlight=False)
    before, after = data.get("anomaly_before"), data.get("anomaly_after")
    console.print(f"anomaly mode before: {txt(before, 200)}; after: {txt(after, 200)}"
                  + ("; a call still running restores it when it returns" if data.get("restore_pending") else ""),
                  highlight=False)
