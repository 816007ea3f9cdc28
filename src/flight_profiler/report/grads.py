"""Gradient-health documents (``torch grads`` output, format ``flight_profiler.grads`` v1).

Non-finite numbers travel as the strings "nan", "inf", "-inf" (JSON has none); they come back
as floats here.

``check_grads`` validates the shape of every field a reader uses (the grad-health, graph-chain
and eval-with-grad rules, the terminal view): a file that passes cannot end a report in a
traceback, and one that does not is refused with one line naming the field, e.g.
``measurements[2].models[0].layers[3]: expected null or a list of 5 figures, found a string``
(docs/commands-torch-grads.md has the format).
"""

from __future__ import annotations

import json
import math
from typing import Any

FORMAT = "flight_profiler.grads"
VERSIONS = (1,)
_MAX_COUNT = 1 << 63


class GradsFormatError(ValueError):
    pass


def num(v: Any) -> float | None:
    """A figure of the document as a float (None when absent)."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer beyond a float: as good as infinite
        return math.inf if v > 0 else -math.inf


def finite(v: Any) -> bool:
    x = num(v)
    return x is not None and math.isfinite(x)


# Real documents nest 6 deep (measurements[k].models[i].layers[j][0]); the document is passed
# to the report as it is, and writing it out recurses once per level.
MAX_DEPTH = 32


def deeper_than(obj: Any, limit: int) -> bool:
    """Whether ``obj`` (parsed JSON) nests containers more than ``limit`` deep; iterative."""
    todo = [(obj, 0)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, (dict, list)):
            if depth >= limit:
                return True
            todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def parse_grads(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GradsFormatError(f"invalid JSON at character {exc.pos}: {exc.msg}") from None
    except RecursionError:
        raise GradsFormatError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer over 4300 digits
        raise GradsFormatError(f"invalid JSON: {exc}") from None
    return check_grads(obj)


def _what(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    return "an object" if isinstance(v, dict) else type(v).__name__


def _bad(where: str, expected: str, v: Any) -> GradsFormatError:
    return GradsFormatError(f"{where}: expected {expected}, found {_what(v)}")


def _figure(where: str, v: Any) -> None:
    """A measured figure: a number, null, or a number as a string ("nan", "inf", "-inf")."""
    if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
        return
    if isinstance(v, str) and len(v) <= 32 and num(v) is not None:
        return
    raise _bad(where, "a number, null or \"nan\"/\"inf\"", v)


def _count(where: str, v: Any, optional: bool = True) -> None:
    if v is None and optional:
        return
    if type(v) is not int or not 0 <= v < _MAX_COUNT:
        raise _bad(where, "a count (an integer >= 0)", v)


def _text(where: str, v: Any, optional: bool = False) -> None:
    if v is None and optional:
        return
    if not isinstance(v, str):
        raise _bad(where, "a string", v)


def _list(where: str, v: Any, optional: bool = True) -> list[Any]:
    if v is None and optional:
        return []
    if not isinstance(v, list):
        raise _bad(where, "a list", v)
    return v


def _dict(where: str, v: Any, optional: bool = False) -> dict[str, Any]:
    if v is None and optional:
        return {}
    if not isinstance(v, dict):
        raise _bad(where, "an object", v)
    return v


def _model(where: str, m: Any) -> None:
    m = _dict(where, m)
    _text(f"{where}.name", m.get("name"))
    _text(f"{where}.class", m.get("class"))
    _count(f"{where}.numel", m.get("numel"), optional=False)
    _count(f"{where}.params", m.get("params"))
    _count(f"{where}.layers_left_out", m.get("layers_left_out"))
    for i, layer in enumerate(_list(f"{where}.layers", m.get("layers"))):
        at = f"{where}.layers[{i}]"
        layer = _dict(at, layer)
        _text(f"{at}.name", layer.get("name"))
        for k, d in enumerate(_list(f"{at}.shape", layer.get("shape"))):
            _count(f"{at}.shape[{k}]", d, optional=False)
        _count(f"{at}.numel", layer.get("numel"))
    for i, index in enumerate(_list(f"{where}.unstepped_layers", m.get("unstepped_layers"))):
        _count(f"{where}.unstepped_layers[{i}]", index, optional=False)


def _figures(where: str, f: Any) -> None:
    """One model's figures in one measurement."""
    f = _dict(where, f)
    for key in ("grad_norm", "weight_norm", "elapsed_s"):
        _figure(f"{where}.{key}", f.get(key))
    for key in ("with_grad", "without_grad", "unreadable", "nonfinite_grad_layers",
                "nonfinite_weight_layers"):
        _count(f"{where}.{key}", f.get(key))
    for i, row in enumerate(_list(f"{where}.layers", f.get("layers"))):
        at = f"{where}.layers[{i}]"
        if row is None:
            continue
        if not isinstance(row, list) or len(row) != 5:
            raise _bad(at, "null or a list of 5 figures", row)
        _figure(f"{at}[0]", row[0])
        _figure(f"{at}[1]", row[1])
        _count(f"{at}[2]", row[2], optional=False)
        _count(f"{at}[3]", row[3], optional=False)
        _figure(f"{at}[4]", row[4])
    for i, w in enumerate(_list(f"{where}.weight_norms", f.get("weight_norms"))):
        _figure(f"{where}.weight_norms[{i}]", w)
    _text(f"{where}.thread", f.get("thread"), optional=True)


def _measurement(where: str, m: Any, n_models: int) -> None:
    m = _dict(where, m)
    _figure(f"{where}.time", m.get("time"))
    _count(f"{where}.call", m.get("call"))
    models = _list(f"{where}.models", m.get("models"), optional=False)
    if len(models) != n_models:
        raise GradsFormatError(f"{where}.models: {len(models)} entries for {n_models} models "
                               "(a measurement must cover every model)")
    for i, f in enumerate(models):
        _figures(f"{where}.models[{i}]", f)
    autograd = m.get("autograd")
    if autograd is not None:
        at = f"{where}.autograd"
        autograd = _dict(at, autograd)
        if not isinstance(autograd.get("grad_enabled"), (bool, type(None))):
            raise _bad(f"{at}.grad_enabled", "true or false", autograd.get("grad_enabled"))
        for key in ("saved_tensors", "saved_bytes", "unpacked"):
            _count(f"{at}.{key}", autograd.get(key))
    for i, scale in enumerate(_list(f"{where}.grad_scales", m.get("grad_scales"), optional=True) or []):
        _figure(f"{where}.grad_scales[{i}]", scale)
    carried = m.get("carried")
    if carried is not None:
        for name, c in _dict(f"{where}.carried", carried).items():
            at = f"{where}.carried[{name[:40]!r}]"
            c = _dict(at, c)
            if not isinstance(c.get("chained"), (bool, type(None))):
                raise _bad(f"{at}.chained", "true, false or null", c.get("chained"))
            _count(f"{at}.walked", c.get("walked"))


def _optimizer(where: str, o: Any, n_models: int) -> None:
    o = _dict(where, o)
    _text(f"{where}.class", o.get("class"))
    model = o.get("model")
    if model is not None and (type(model) is not int or not 0 <= model < max(n_models, 1)):
        raise _bad(f"{where}.model", f"a model index below {n_models}", model)
    for i, m in enumerate(_list(f"{where}.models", o.get("models"))):
        if type(m) is not int or not 0 <= m < max(n_models, 1):
            raise _bad(f"{where}.models[{i}]", f"a model index below {n_models}", m)
    for key in ("params", "steps", "zero_grad_calls"):
        _count(f"{where}.{key}", o.get(key))
    _figure(f"{where}.lr", o.get("lr"))


def _zeroing(z: Any) -> None:
    z = _dict("zeroing", z, optional=True)
    if not isinstance(z.get("observed"), (bool, type(None))):
        raise _bad("zeroing.observed", "true or false", z.get("observed"))
    for i, c in enumerate(_list("zeroing.module_zero_grad_calls", z.get("module_zero_grad_calls"))):
        _count(f"zeroing.module_zero_grad_calls[{i}]", c, optional=False)


def _anomaly(a: Any) -> None:
    a = _dict("anomaly", a, optional=True)
    first = a.get("first")
    if first is None:
        return
    first = _dict("anomaly.first", first)
    for key in ("op", "phase", "backward_node"):
        _text(f"anomaly.first.{key}", first.get(key), optional=True)
    for i, line in enumerate(_list("anomaly.first.forward_stack", first.get("forward_stack"))):
        _text(f"anomaly.first.forward_stack[{i}]", line)


def check_grads(obj: Any) -> dict[str, Any]:
    """``obj`` (a parsed document) if every field a reader uses has its shape; else
    GradsFormatError naming the first field that does not."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise GradsFormatError("not a gradient-health document (no \"format\": \"flight_profiler.grads\")")
    if deeper_than(obj, MAX_DEPTH):
        raise GradsFormatError(f"nested more than {MAX_DEPTH} deep: not a torch grads document")
    version = obj.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise GradsFormatError(f"grads version {str(version)[:20]!r} is not supported (this reads {VERSIONS})")
    if obj.get("models") is None or obj.get("measurements") is None:
        raise GradsFormatError("missing 'models' or 'measurements'")
    models = _list("models", obj.get("models"), optional=False)
    measurements = _list("measurements", obj.get("measurements"), optional=False)
    for key in ("label", "mode", "target"):
        _text(key, obj.get(key), optional=True)
    pid = obj.get("pid")
    if pid is not None and (type(pid) is not int or not 0 <= pid < 1 << 32):
        raise _bad("pid", "a process id", pid)
    _figure("time", obj.get("time"))
    for i, m in enumerate(models):
        _model(f"models[{i}]", m)
    for k, m in enumerate(measurements):
        _measurement(f"measurements[{k}]", m, len(models))
    for i, o in enumerate(_list("optimizers", obj.get("optimizers"))):
        _optimizer(f"optimizers[{i}]", o, len(models))
    _zeroing(obj.get("zeroing"))
    _anomaly(obj.get("anomaly"))
    return {**obj, "kind": "grads"}
