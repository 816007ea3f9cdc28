"""Tests only (the aimed kill loop, bench/bench_injector_kills.py): make the injector stop
itself just before a chosen ptrace request or memory write, so that a kill lands exactly there.

``FLIGHT_PROFILER_TEST_PAUSE_AT=K``: before its K-th step the injector says so on stderr
(``fp-paused K what``) and sends itself SIGSTOP; ``list``: every step is named on stderr.
Unset (always, outside the tests), each step costs one comparison.
"""

from __future__ import annotations

import os
import signal

PAUSE_AT = os.environ.get("FLIGHT_PROFILER_TEST_PAUSE_AT", "")
count = [0]


def step(what: str) -> None:
    if not PAUSE_AT:
        return
    count[0] += 1
    if PAUSE_AT == "list":
        os.write(2, f"fp-step {count[0]} {what}\n".encode())
    elif str(count[0]) == PAUSE_AT:
        os.write(2, f"fp-paused {count[0]} {what}\n".encode())
        os.kill(os.getpid(), signal.SIGSTOP)
