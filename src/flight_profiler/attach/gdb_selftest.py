"""Prove that a gdb can call a function in a process AND restore it, before it touches a target.

Debian 12's gdb 13.1 fails every inferior call on kernels and CPUs whose XSAVE area it cannot
write back (AVX-512/AMX): the borrowed thread's interrupted system call then returns a
kernel-internal errno (ERESTART_RESTARTBLOCK) into user space and the target dies. So before any
gdb call into a user's process, the same gdb makes one call into a throwaway child sleeping in
``time.sleep``; the child must wake up normally afterwards. The verdict is cached per gdb binary
(path, size, mtime) and kernel release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable

from flight_profiler.errors import AttachFailed

_CHILD = (
    "import sys, time\n"
    "sys.stdout.write('R\\n'); sys.stdout.flush()\n"
    "time.sleep(0.6)\n"
    "sys.stdout.write('OK\\n')\n"
)


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "flight_profiler", "gdb-selftest.json")


def _key(gdb: str) -> str:
    real = os.path.realpath(gdb)
    st = os.stat(real)
    return f"{real}|{st.st_size}|{int(st.st_mtime)}|{os.uname().release}"


def _load() -> dict[str, dict[str, object]]:
    try:
        with open(cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _store(key: str, verdict: dict[str, object]) -> None:
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        data = _load()
        data[key] = verdict
        fd, tmp = tempfile.mkstemp(prefix=".gdb-selftest-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass  # an uncached verdict only costs the test again next time


def run_selftest(gdb: str, timeout: float = 20.0) -> tuple[bool, str]:
    """(works, why) for ``gdb``: one cast call into a sleeping child, which must live on."""
    child = subprocess.Popen([sys.executable, "-S", "-c", _CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != b"R":
            return False, "the self-test child did not start"
        time.sleep(0.05)  # let it enter the sleep
        argv = [gdb, "-nx", "-batch", "-iex", "set auto-load off", "-iex",
                "set debuginfod enabled off", "-iex", "set confirm off", "-p", str(child.pid),
                "-ex", "call ((int(*)(void))getpid)()", "-ex", "detach"]
        try:
            run = subprocess.run(argv, capture_output=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, "LC_ALL": "C"})
        except subprocess.TimeoutExpired:
            return False, f"gdb did not finish a call in {timeout:.0f}s"
        except OSError as exc:
            return False, f"gdb could not be run: {exc}"
        text = (run.stdout + run.stderr).decode("utf-8", "replace")
        try:
            out, err = child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            return False, "the self-test child hung after gdb's call"
        called = f"= {child.pid}" in text
        survived = child.returncode == 0 and out.strip().endswith(b"OK")
        if called and survived:
            return True, "a call returned the right value and the child lived on"
        problem = next((ln.strip() for ln in text.splitlines()
                        if "ouldn't" in ln or "rror" in ln), "")
        if not called:
            return False, f"gdb could not make a call ({problem or 'no result printed'})"
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return False, f"the child died after gdb's call ({tail[0]})"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def check(gdb: str, say: Callable[[str], None] | None = None) -> None:
    """Raise AttachFailed (naming cause and fix) unless ``gdb`` passed its self-test here."""
    key = _key(gdb)
    cached = _load().get(key)
    if cached is None:
        ok, why = run_selftest(gdb)
        cached = {"ok": ok, "why": why}
        _store(key, cached)
    if say is not None:
        say(f"gdb self-test ({gdb}): {'passed' if cached['ok'] else 'FAILED'}: {cached['why']}")
    if not cached.get("ok"):
        raise AttachFailed(
            f"{gdb} cannot safely call into a process on this machine: {cached['why']}; "
            "the target was not touched",
            "use the built-in injector (--method auto or ptrace, x86-64), or install a newer "
            "gdb (e.g. `pip install gdb-for-pwndbg`) and point $FLIGHT_PROFILER_GDB at it",
        )
