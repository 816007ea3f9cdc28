"""Real target processes for tests: spawn a Python program, wait until it says it is ready.

A target writes its stdout/stderr to files (never a pipe that could fill up and block it), so a
test can also assert that the agent printed nothing into the target's own output.
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TRACES = SHARED / "fixtures" / "traces"


def find_pythons() -> dict[str, str]:
    """Installed CPython interpreters by ``major.minor`` (3.9 .. 3.14), pyenv's included."""
    found: dict[str, str] = {}
    for minor in range(9, 15):
        version = f"3.{minor}"
        path = shutil.which(f"python{version}")
        # pyenv shims exist for every version but only run the ones that are "global".
        if path and "/shims/" in path:
            path = None
        if not path:
            hits = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
            path = hits[-1] if hits else None
        if path and os.access(path, os.X_OK):
            found[version] = path
    return found


PYTHONS = find_pythons()


_TEMP_DIRS: list[Path] = []


def temp_dir(prefix: str = "fp-test-") -> Path:
    """A new directory under /tmp, removed when the test run ends: for what must exist outside
    pytest's tmp_path (a target's files, stop files made before the test body runs, a directory
    another uid must read: pytest's are root-only)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _TEMP_DIRS.append(path)
    return path


def remove_temp_dirs() -> None:
    """Remove every temp_dir() made so far (targets still running keep their open files)."""
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


atexit.register(remove_temp_dirs)  # also when support is used outside pytest (bench, by hand)


_OTHER_USER_OK: dict[int, bool] = {}


def other_user_can_run_us(uid: int = 65534) -> bool:
    """uid ``uid`` can run this checkout's interpreter and import flight_profiler (false when the
    checkout sits under a directory only root can enter): the second-user tests need it."""
    if uid not in _OTHER_USER_OK:
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            _OTHER_USER_OK[uid] = False
        else:
            probe = subprocess.run(
                ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                 sys.executable, "-c", f"import sys, flight_profiler; assert sys.prefix == {sys.prefix!r}"],
                capture_output=True, timeout=60, cwd="/")
            _OTHER_USER_OK[uid] = probe.returncode == 0
    return _OTHER_USER_OK[uid]


def torch_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except ValueError:
        return False


class Target:
    def __init__(self, popen: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.out_path = out
        self.err_path = err

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, pattern: str, timeout: float = 30.0, start: int = 0) -> re.Match[str]:
        """Wait until ``pattern`` (a regex) appears in the target's stdout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.stdout[start:])
            if m:
                return m
            if not self.alive():
                raise AssertionError(
                    f"target exited ({self.popen.returncode}) before {pattern!r}:\n"
                    f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"
                )
            time.sleep(0.02)
        raise AssertionError(f"target did not print {pattern!r} in {timeout}s: {self.stdout[-2000:]}")

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return self.popen.returncode


def spawn(
    code: str,
    python: str = sys.executable,
    ready: str | None = "READY",
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    args: tuple[str, ...] = (),
) -> Target:
    """Start ``python -c code`` (dedented) and wait for ``ready`` on its stdout."""
    tmp = temp_dir("fp-target-")
    script = tmp / "target_main.py"
    script.write_text(textwrap.dedent(code))
    out, err = tmp / "stdout", tmp / "stderr"
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    with open(out, "wb") as o, open(err, "wb") as e:
        popen = subprocess.Popen(
            [python, str(script), *args], stdout=o, stderr=e, stdin=subprocess.DEVNULL,
            env=full_env, cwd=cwd or str(tmp),
        )
    target = Target(popen, out, err)
    if ready:
        target.wait_for(ready, timeout)
    return target
