"""``flight_profiler diagnose``: the whole diagnosis workflow against a live process.

:func:`~flight_profiler.diagnose.workflow.run_diagnosis` is the service (plain data in and out);
the click commands in ``cli/diagnose_cmd.py`` and ``cli/demo_cmd.py`` only parse, attach and
render.
"""

from __future__ import annotations

from flight_profiler.diagnose.model import (
    DiagnoseOptions,
    DiagnoseResult,
    MethodTarget,
    PhaseResult,
)

__all__ = ["DiagnoseOptions", "DiagnoseResult", "MethodTarget", "PhaseResult", "default_out_dir"]


def default_out_dir(pid: int, prefix: str = "flight_profiler") -> str:
    import os
    import time

    return os.path.abspath(f"{prefix}-{pid}-{time.strftime('%Y%m%d-%H%M%S')}")
