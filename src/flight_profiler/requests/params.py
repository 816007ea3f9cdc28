"""Option types that refuse what click's own would let through."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and inf (nan passes every comparison click makes:
    `--timeout nan` became a traceback, `watch --timeout inf` a watch that never ends)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
