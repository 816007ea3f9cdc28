"""Gradient-health documents (``torch grads`` output, format ``flight_profiler.grads`` v1).

Non-finite numbers travel as the strings "nan", "inf", "-inf" (JSON has none); they come back
as floats here.
"""

from __future__ import annotations

import json
import math
from typing import Any

FORMAT = "flight_profiler.grads"
VERSIONS = (1,)


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
    return float(v)


def finite(v: Any) -> bool:
    x = num(v)
    return x is not None and math.isfinite(x)


def parse_grads(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GradsFormatError(f"invalid JSON at character {exc.pos}: {exc.msg}") from None
    return check_grads(obj)


def check_grads(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise GradsFormatError("not a gradient-health document (no \"format\": \"flight_profiler.grads\")")
    if obj.get("version") not in VERSIONS:
        raise GradsFormatError(f"grads version {obj.get('version')!r} is not supported (this reads {VERSIONS})")
    models = obj.get("models")
    measurements = obj.get("measurements")
    if not isinstance(models, list) or not isinstance(measurements, list):
        raise GradsFormatError("missing 'models' or 'measurements'")
    for m in measurements:
        if not isinstance(m, dict) or not isinstance(m.get("models"), list) or len(m["models"]) != len(models):
            raise GradsFormatError("a measurement does not cover every model")
    return {**obj, "kind": "grads"}
