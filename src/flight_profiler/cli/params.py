"""Option types for the CLI's own options; they live beside the command grammar that uses them
too (flight_profiler.requests), which must not import cli/."""

from __future__ import annotations

from flight_profiler.requests.params import FiniteFloatRange

__all__ = ["FiniteFloatRange"]
