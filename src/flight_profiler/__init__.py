"""flight_profiler: look inside a running PyTorch job without restarting it.

The public Python API lives in :mod:`flight_profiler.api`; it is what the CLI is built on.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
