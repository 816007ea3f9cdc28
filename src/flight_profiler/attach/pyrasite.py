"""Optional: inject through pyrasite (``--method pyrasite``), only if the user installed it.

pyrasite runs PyGILState_Ensure/PyRun_SimpleString from gdb in whatever thread is stopped: it can
hang on a busy GIL and does nothing on stripped distro Pythons. It is offered for comparison and
for users who already trust it; it is never a dependency and never chosen automatically.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

from flight_profiler.errors import AttachFailed, pyrasite_missing


def available() -> bool:
    try:
        return importlib.util.find_spec("pyrasite") is not None
    except (ImportError, ValueError):
        return False


def inject(pid: int, text: str, timeout: float) -> None:
    if not available():
        raise pyrasite_missing()
    import subprocess  # here: only an injection by pyrasite pays for them (issue 23)
    import tempfile

    fd, path = tempfile.mkstemp(prefix="flight_profiler-", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    try:
        proc = subprocess.run([sys.executable, "-m", "pyrasite", str(pid), path],
                              capture_output=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise AttachFailed(f"pyrasite did not return within {timeout:.0f}s",
                           "its gdb may be waiting for the GIL; use --method gdb") from None
    finally:
        # pyrasite's gdb has returned (or timed out): the target reads the file during the call
        with contextlib.suppress(OSError):
            os.unlink(path)
    if proc.returncode != 0:
        raise AttachFailed(f"pyrasite failed: {proc.stderr.decode(errors='replace').strip()[-200:]}",
                           "use --method gdb")
