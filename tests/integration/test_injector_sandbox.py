"""Targets the injection could harm or mistake (issue 19): seccomp sandboxes that kill on the
injection's calls are refused with the target untouched, and a pid that now belongs to another
process is never injected into."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flight_profiler.attach import ptrace
from flight_profiler.errors import ExitCode
from support import PYTHONS, Target, other_user_can_run_us, spawn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(not ptrace.supported(), reason="x86-64 Linux only")]

CLI = [sys.executable, "-m", "flight_profiler"]
PYTHON = PYTHONS.get("3.11") or sys.executable

# Installs a seccomp filter on itself, the way sandboxes do (libseccomp's shape: the arch, then
# the system call number), then sleeps and beats. argv[1] names the filter.
FILTER = r'''
import ctypes, os, struct, sys

ALLOW, KILL, TRAP, ERRNO = 0x7FFF0000, 0x80000000, 0x00030000, 0x00050000


def program(kind):
    asm = [(0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, KILL), (0x20, 0, 0, 0)]
    if kind == "kill-exec-mmap":  # mmap with PROT_EXEC (argument 2, bit 4)
        asm += [(0x15, 0, 3, 9), (0x20, 0, 0, 32), (0x45, 0, 1, 4), (0x06, 0, 0, KILL)]
    elif kind == "kill-threads":  # clone with CLONE_THREAD; clone3 answers ENOSYS (as Docker)
        asm += [(0x15, 0, 1, 435), (0x06, 0, 0, ERRNO | 38), (0x15, 0, 3, 56),
                (0x20, 0, 0, 16), (0x45, 0, 1, 0x10000), (0x06, 0, 0, TRAP)]
    elif kind == "harmless":  # reboot and acct: EPERM; everything else allowed
        asm += [(0x15, 1, 0, 169), (0x15, 0, 1, 163), (0x06, 0, 0, ERRNO | 1)]
    asm.append((0x06, 0, 0, ALLOW))
    return b"".join(struct.pack("<HBBI", *i) for i in asm)


def install(kind):
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(program(kind))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code.raw) // 8, ctypes.addressof(code))
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()
'''

TARGET = FILTER + r'''
import time
install(sys.argv[1])
os.write(1, b"READY\n")
i = 0
while True:
    time.sleep(0.02)
    i += 1
    os.write(1, f"hb {i}\n".encode())
'''

# Strict mode allows read, write and exit only: READY, then blocked in read() for good.
STRICT = r'''
import ctypes, os
r, w = os.pipe()
os.write(1, b"READY\n")
ctypes.CDLL(None).prctl(22, 1, 0, 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_STRICT
os.write(1, b"strict\n")
os.read(r, 1)
'''

# The CLI run under a filter of its own (a CLI inside the target's container).
CLI_UNDER = FILTER + r'''
install(sys.argv[1])
os.execv(sys.executable, [sys.executable, "-m", "flight_profiler", *sys.argv[2:]])
'''


def beats(t: Target) -> int:
    found = re.findall(r"^hb (\d+)$", t.stdout, re.M)
    return int(found[-1]) if found else 0


def assert_untouched(t: Target) -> None:
    start, deadline = beats(t), time.monotonic() + 20
    while beats(t) < start + 5:
        assert t.alive(), f"the target died ({t.popen.returncode}): {t.stderr[-500:]}"
        assert time.monotonic() < deadline, "the target stopped beating"
        time.sleep(0.05)
    status = Path(f"/proc/{t.pid}/status").read_text()
    assert re.search(r"TracerPid:\s+0\n", status), status
    assert t.stderr == ""


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("kind, call", [("kill-exec-mmap", "mmap(PROT_READ|PROT_EXEC)"),
                                        ("kill-threads", "clone (a thread)")])
def test_a_filter_that_would_kill_the_target_is_refused_untouched(kind: str, call: str) -> None:
    # GIVEN a job whose seccomp filter kills it (SIGSYS) for one call the injection makes
    t = spawn(TARGET, python=PYTHON, args=(kind,))
    try:
        # WHEN root attaches
        proc = cli(str(t.pid), "--cmd", "status")
        # THEN one clear line names the sandbox and the call; the job beats on, untraced
        assert proc.returncode == ExitCode.ATTACH_FAILED, proc.stderr
        assert "seccomp" in proc.stderr and call in proc.stderr, proc.stderr
        assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]) == 1
        assert_untouched(t)
    finally:
        t.popen.kill()
        t.popen.wait(10)


def test_a_filter_that_allows_the_injection_is_read_and_attached_through() -> None:
    t = spawn(TARGET, python=PYTHON, args=("harmless",))
    try:
        proc = cli(str(t.pid), "--cmd", "status", "--timeout", "60", "-v")
        assert proc.returncode == 0, proc.stderr
        assert "1 seccomp filter(s) read: they allow" in proc.stderr
        assert cli(str(t.pid), "--cmd", "detach").returncode == 0
        assert_untouched(t)
    finally:
        t.popen.kill()
        t.popen.wait(10)


def test_strict_mode_is_refused_before_anything_is_touched() -> None:
    t = spawn(STRICT, python=PYTHON)
    try:
        t.wait_for("strict")
        proc = cli(str(t.pid), "--cmd", "status")
        assert proc.returncode == ExitCode.ATTACH_FAILED, proc.stderr
        assert "strict mode" in proc.stderr
        time.sleep(0.3)
        assert t.alive(), t.popen.returncode  # strict mode kills on any other call
        status = Path(f"/proc/{t.pid}/status").read_text()
        assert re.search(r"TracerPid:\s+0\n", status) and "Seccomp:\t1" in status
    finally:
        t.popen.kill()
        t.popen.wait(10)


def test_a_filter_this_cli_cannot_read_is_refused_with_the_way_to_check_it() -> None:
    # GIVEN a job of uid 65534 under a filter, and a CLI of that uid (no CAP_SYS_ADMIN)
    if not (shutil.which("setpriv") and other_user_can_run_us()):
        pytest.skip("needs root, setpriv and a checkout uid 65534 can run")
    as_user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    t = spawn(TARGET, python=PYTHON, args=("harmless",))
    t.popen.kill()
    t.popen.wait(10)
    out = Path(t.out_path)
    out.write_bytes(b"")
    os.chmod(out.parent, 0o777)
    script = out.parent / "target_main.py"
    with open(out, "wb") as o, open(t.err_path, "wb") as e:
        popen = subprocess.Popen([*as_user, PYTHON, str(script), "harmless"], stdout=o, stderr=e,
                                 stdin=subprocess.DEVNULL, cwd="/")
    user_target = Target(popen, out, t.err_path)
    try:
        user_target.wait_for("READY")
        # WHEN that user attaches
        proc = subprocess.run([*as_user, *CLI, str(popen.pid), "--cmd", "status"],
                              capture_output=True, text=True, timeout=120, cwd="/")
        # THEN it is refused: whether the filter kills is unknown, and the hint says how to know
        assert proc.returncode == ExitCode.ATTACH_FAILED, proc.stderr
        assert "cannot be read" in proc.stderr and "root" in proc.stderr, proc.stderr
        assert_untouched(user_target)
    finally:
        popen.kill()
        popen.wait(10)


@pytest.mark.parametrize("kind, works", [("harmless", True), ("kill-threads", False)])
def test_a_cli_in_the_same_sandbox_tests_the_filter_on_itself(kind: str, works: bool) -> None:
    # GIVEN a job and a CLI under the same filter (as in one container): root under seccomp
    # cannot read filters, but the same filter can be tried in a child of the CLI
    t = spawn(TARGET, python=PYTHON, args=(kind,))
    try:
        proc = subprocess.run([sys.executable, "-c", CLI_UNDER, kind, str(t.pid), "--cmd",
                               "status", "--timeout", "60", "-v"], capture_output=True, text=True, timeout=120)
        if works:
            assert proc.returncode == 0, proc.stderr
            assert "same filters in this CLI let a test child through" in proc.stderr
            assert cli(str(t.pid), "--cmd", "detach").returncode == 0
        else:
            assert proc.returncode == ExitCode.ATTACH_FAILED, proc.stderr
            assert "clone" in proc.stderr and "the same as this CLI's" in proc.stderr
        assert_untouched(t)
    finally:
        t.popen.kill()
        t.popen.wait(10)


# Runs as pid namespace's init's child (unshare --pid --fork --mount-proc): nothing else forks
# there, so ns_last_pid hands a dead target's pid to the process we start next.
REUSE = r'''
import json, os, subprocess, sys, time
from flight_profiler.attach import identity, process, ptrace, ptrace_inject
from flight_profiler.errors import ProcessNotFound

PY, SLEEPER = sys.argv[1], sys.argv[2]
out = {}


def start(at=None):
    if at is not None:
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(at - 1))
    p = subprocess.Popen([PY, "-c", SLEEPER], stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"READY\n"
    return p


def untouched(p):
    status = open(f"/proc/{p.pid}/status").read()
    ok = p.poll() is None and "TracerPid:\t0\n" in status and "State:\tt" not in status
    return ok or f"exit {p.poll()}: {status}"


# 1: the pre-flight saw A; A exits; B, started later, takes its pid before the injection
a = start()
seen = process.inspect(a.pid, check_permissions=False)
a.kill(); a.wait()
b = start(at=seen.pid)
out["reused"] = b.pid == seen.pid
try:
    ptrace_inject.inject(seen, "import os; os._exit(3)", "import os; os._exit(3)")
    out["injection"] = "went on"
except ProcessNotFound as exc:
    out["injection"] = str(exc)
time.sleep(0.3)
out["b_untouched"] = untouched(b)

# 2: pinned while A lived; the pid changes hands between the pin and PTRACE_SEIZE
a = start()
seen = process.inspect(a.pid, check_permissions=False)
pin = identity.Pin(seen)
a.kill(); a.wait()
c = start(at=seen.pid)
out["reused2"] = c.pid == seen.pid
tracee = ptrace.Tracee(seen.pid, check=pin.check)
try:
    tracee.attach()
    out["seize"] = "went on"
    tracee.detach()
except ProcessNotFound as exc:
    out["seize"] = str(exc)
time.sleep(0.3)
out["c_untouched"] = untouched(c)
print(json.dumps(out))
for p in (b, c):
    p.kill()
'''


def test_a_pid_that_changed_hands_is_never_injected() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a private pid namespace")
    sleeper = "import os, time\nos.write(1, b'READY\\n')\nwhile True: time.sleep(0.05)\n"
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                           REUSE, PYTHON, sleeper], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # GIVEN the pid really went to another process each time
    assert out["reused"] and out["reused2"], out
    # THEN nothing ran in it: refused before the seize, and right after a seize that landed
    # on the new process; that process goes on untraced and unharmed
    assert "pid was reused" in out["injection"] and "nothing was injected" in out["injection"]
    assert "nothing was injected" in out["seize"], out  # the pinned one is known gone
    assert out["b_untouched"] is True and out["c_untouched"] is True, out
