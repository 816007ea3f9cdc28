"""The processes and helpers of issue 19's privilege scenarios (``privilege_scenarios.py``):
targets that beat (as root, as uid 65534, as a root job that called seteuid, in namespaces),
the CLI as root or as another uid, and a tally of attacks tried and held."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
USER = 65534
CLI = [sys.executable, "-m", "flight_profiler"]
TMPFS_SIZE = "64m"
BEAT_DIR = "/var/tmp"  # a private tmpfs too, in the scenario's namespace

BEATING = r"""
import os, sys, time
{prelude}
out = open(sys.argv[1], "a", buffering=1)
out.write("READY\n")
def fp_beat(i):
    return i + 1
i = 0
while True:
    i = fp_beat(i)
    out.write(f"hb {{i}}\n")
    time.sleep(0.02)
"""

# A root job that dropped its effective uid for a while (real and saved uid stay 0).
SETEUID_PRELUDE = "os.setegid(65534); os.seteuid(65534)"


def python() -> str:
    """The interpreter targets run: the system's, whose standard library every uid can read (a
    job running as uid 65534, even for a while, imports from it; /root/.pyenv is root's only)."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


# -- processes ------------------------------------------------------------------------------------
class Beater:
    """A target that writes a heartbeat into a file; ``beating()`` proves it runs on."""

    def __init__(self, prelude: str = "", user: int | None = None,
                 wrap: list[str] | None = None) -> None:
        # its files live apart from /tmp, which some scenarios fill up or make read-only
        self.dir = Path(tempfile.mkdtemp(prefix="fp-target-", dir=BEAT_DIR))
        self.dir.chmod(0o777)
        script, self.out = self.dir / "t.py", self.dir / "out"
        script.write_text(BEATING.format(prelude=prelude))
        self.out.touch()
        self.out.chmod(0o666)
        argv = [python(), str(script), str(self.out)]
        if user is not None:
            argv = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", *argv]
        argv = [*(wrap or []), *argv]
        with open(self.dir / "err", "wb") as err:
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err, cwd="/")
        deadline = time.monotonic() + 30
        while b"READY" not in self.out.read_bytes():
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError(f"target did not start: {(self.dir / 'err').read_text()}")
            time.sleep(0.05)
        self.pid = self.python_pid()

    def python_pid(self) -> int:
        """The interpreter's pid (a wrapper such as unshare may sit between)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pid in [self.popen.pid, *_descendants(self.popen.pid)]:
                try:
                    if "python" in os.readlink(f"/proc/{pid}/exe"):
                        return pid
                except OSError:
                    pass
            time.sleep(0.05)
        return self.popen.pid

    def beats(self) -> int:
        lines = [ln for ln in self.out.read_text().splitlines() if ln.startswith("hb ")]
        return int(lines[-1].split()[1]) if lines else 0

    def beating(self, by: int = 5, timeout: float = 20.0) -> bool:
        start, deadline = self.beats(), time.monotonic() + timeout
        while self.beats() < start + by:
            if time.monotonic() > deadline or self.popen.poll() is not None:
                return False
            time.sleep(0.05)
        return True

    def uid_line(self) -> str:
        with open(f"/proc/{self.pid}/status") as f:
            return next(ln for ln in f if ln.startswith("Uid:")).split(":", 1)[1].split()

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _descendants(pid: int) -> list[int]:
    out = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in children:
        out.append(int(child))
        out.extend(_descendants(int(child)))
    return out


@contextmanager
def beater(prelude: str = "", user: int | None = None,
           wrap: list[str] | None = None) -> Iterator[Beater]:
    t = Beater(prelude, user, wrap)
    try:
        yield t
    finally:
        t.stop()


def cli(*args: str, timeout: float = 90.0, user: int | None = None) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, *args]
    if user is not None:
        argv = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def as_user(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups",
                           sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, cwd="/")


def one_clean_line(proc: subprocess.CompletedProcess[str]) -> bool:
    """A refusal as the brief wants it: non-zero, ``error:`` first, no traceback."""
    return (proc.returncode not in (0, None) and proc.stderr.startswith("error: ")
            and "Traceback" not in proc.stderr and "Traceback" not in proc.stdout)


def root_only_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="fp-rootonly-"))
    d.chmod(0o700)
    return d


def user_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="fp-userdir-"))
    os.chown(d, USER, USER)
    return d


class Tally:
    def __init__(self) -> None:
        self.tried = 0
        self.held = 0
        self.notes: list[str] = []

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.tried += 1
        self.held += bool(ok)
        self.notes.append(f"{'held' if ok else 'FAILED'}: {what}" + (f" ({detail})" if detail and not ok else ""))

    def result(self) -> dict[str, Any]:
        return {"tried": self.tried, "held": self.held, "notes": self.notes}


# -- helpers for the socket attacks ---------------------------------------------------------------
HELLO_PROBE = r"""
import json, os, socket, struct, sys
answered = []
for path in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(path)
        body = json.dumps({"type": "hello", "protocol": 1, "client": "probe"}).encode()
        s.sendall(struct.pack(">I", len(body)) + body)
        head = s.recv(4)
        if len(head) == 4:
            answered.append(path)
    except OSError:
        pass
    finally:
        s.close()
print(json.dumps(answered))
"""


def agent_socket_paths(pid: int) -> list[str]:
    """Every Unix socket path bound for ``pid``'s agent (as /proc/net/unix lists them), and the
    conventional names in each private directory."""
    from flight_profiler.agent import protocol

    key = protocol.socket_name(pid, protocol.pid_namespace(pid))
    found = set()
    with open("/proc/net/unix") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[-1].endswith(key):
                found.add(parts[-1])
    for d in Path("/tmp").glob("flight_profiler-*"):
        found.add(str(d / key))
    return sorted(found)


def hello_answered(paths: list[str], fs_root: bool = False) -> list[str]:
    """Which paths answer a hello from uid 65534 (``fs_root``: a root process that set its
    effective uid to 65534 but kept file-system uid 0, so it can reach any path)."""
    if fs_root:
        code = ("import ctypes, os; libc = ctypes.CDLL(None); os.seteuid(65534); "
                "libc.setfsuid(0)\n" + HELLO_PROBE)
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(paths)],
                              capture_output=True, text=True, timeout=60)
    else:
        proc = subprocess.run(["setpriv", "--reuid", str(USER), "--regid", str(USER),
                               "--clear-groups", sys.executable, "-c", HELLO_PROBE,
                               json.dumps(paths)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return list(json.loads(proc.stdout))


def attach_meets(t: Tally, what: str, target: Beater, ok_codes: tuple[int, ...] = (0,)) -> None:
    proc = cli(str(target.pid), "--cmd", "status", "--timeout", "30")
    fine = proc.returncode in ok_codes or one_clean_line(proc)
    t.check(f"{what}: status works or one clear line", fine and "Traceback" not in proc.stderr,
            f"rc {proc.returncode}: {proc.stderr[-500:]}")
    t.notes.append(f"  ({what}: rc {proc.returncode}: {proc.stderr.strip()[:300]})")
    t.check(f"{what}: the job runs on", target.beating())
    cli(str(target.pid), "--cmd", "detach", "--timeout", "30")


def fill_tmp() -> None:
    fd = os.open("/tmp/filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):  # to the last byte
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
