from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Callable

import pytest

from support import Target, remove_temp_dirs, spawn

# Run by a process that is NOT the sleeper's parent, as the CLI is not its target's parent:
# with kernel.yama.ptrace_scope=1 a parent may trace its child, so probing our own child
# would pass where every attach then fails. PTRACE_SEIZE does not stop the tracee, and the
# kernel detaches it when the prober exits.
_PTRACE_PROBE = r"""
import ctypes, ctypes.util, os, sys
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SEIZE = 0x4206
if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) != 0:
    print(os.strerror(ctypes.get_errno()))
    sys.exit(1)
"""


def ptrace_refusal() -> str | None:
    """Why this machine refuses to ptrace a process of ours that is not our child, or None."""
    if not sys.platform.startswith("linux"):
        return f"attaching needs Linux (this is {sys.platform})"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               stdin=subprocess.DEVNULL)
    try:
        probe = subprocess.run([sys.executable, "-I", "-c", _PTRACE_PROBE, str(sleeper.pid)],
                               capture_output=True, text=True, timeout=30)
    finally:
        sleeper.kill()
        sleeper.wait()
    if probe.returncode == 0:
        return None
    return probe.stdout.strip() or probe.stderr.strip()[-300:] or f"exit {probe.returncode}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    # Before the first test runs and only when a test will attach: without ptrace every one of
    # them would fail on its own, hundreds of times, with the cause buried in each.
    if not any(item.get_closest_marker("integration") or "integration" in item.path.parts
               for item in items):
        return
    refusal = ptrace_refusal()
    if refusal is None:
        return
    from flight_profiler.attach.process import in_container, permission_hint, ptrace_scope

    pytest.exit(
        f"ptrace is refused on this machine ({refusal}), so no test can attach to a target.\n"
        f"Fix: {permission_hint(ptrace_scope(), in_container())}.\n"
        "Or run only the tests that need no attaching: pytest tests/unit",
        returncode=pytest.ExitCode.USAGE_ERROR,
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    remove_temp_dirs()


@pytest.fixture
def spawn_target() -> Iterator[Callable[..., Target]]:
    """spawn_target(code, python=..., ready="READY") -> Target; every target is stopped after."""
    targets: list[Target] = []

    def _spawn(code: str, **kwargs: object) -> Target:
        t = spawn(code, **kwargs)  # type: ignore[arg-type]
        targets.append(t)
        return t

    yield _spawn
    for t in targets:
        t.stop()
