"""Pre-flight from /proc text: version detection, owner, tracer, stopped state, ptrace rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flight_profiler.attach import process
from flight_profiler.errors import AttachFailed, NotPython, PermissionDenied, ProcessNotFound

STATUS = """Name:\tpython3.11
Umask:\t0022
State:\tS (sleeping)
Tgid:\t4242
NSpid:\t4242\t17
Pid:\t4242
PPid:\t1
TracerPid:\t0
Uid:\t1000\t1000\t1000\t1000
Gid:\t1000\t1000\t1000\t1000
CapEff:\t0000000000080000
"""

MAPS_SHARED = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123 /usr/local/bin/python3.12
7f0000000000-7f0000100000 r-xp 00000000 08:01 456 /usr/local/lib/libpython3.12.so.1.0
"""
MAPS_STATIC = """\
00400000-00a00000 r-xp 00000000 08:01 99 /usr/bin/python3.11
7f10000000-7f10001000 r-xp 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
"""
MAPS_RENAMED = """\
00400000-00a00000 r-xp 00000000 08:01 99 /opt/app/bin/trainer
7f2000000000-7f2000001000 r-xp 00000000 08:01 5 /opt/app/lib/python3.10/lib-dynload/_heapq.cpython-310-x86_64-linux-gnu.so
"""


def test_parse_status_fields() -> None:
    st = process.parse_status(STATUS)
    assert st.state == "S" and st.tracer_pid == 0 and st.uids == (1000, 1000, 1000, 1000)
    assert st.ns_pid == 17  # the innermost pid namespace: how a containerised target sees itself
    assert st.cap_eff & (1 << process.CAP_SYS_PTRACE)
    assert st.tgid == 4242


@pytest.mark.parametrize(
    ("exe", "maps", "version", "lib"),
    [
        ("/usr/local/bin/python3.12", MAPS_SHARED, (3, 12), "/usr/local/lib/libpython3.12.so.1.0"),
        ("/usr/bin/python3.11", MAPS_STATIC, (3, 11), None),  # Debian's static interpreter
        ("/opt/app/bin/trainer", MAPS_RENAMED, (3, 10), None),  # embedded/renamed: ext tag
        ("/usr/bin/python3.13t", "", (3, 13), None),
        ("/usr/bin/sleep", "00400000-00401000 r-xp 0 08:01 1 /usr/bin/sleep\n", None, None),
    ],
)
def test_python_version_from_exe_and_maps(exe, maps, version, lib) -> None:
    assert process.python_version_from(exe, maps) == (version, lib)


def test_permission_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    st = process.parse_status(STATUS)
    monkeypatch.setattr(process, "ptrace_scope", lambda: 0)
    process.check_ptrace_allowed(st, 1000, 0, 4242)  # same user, classic rules: fine
    with pytest.raises(PermissionDenied, match="belongs to uid 1000, you are uid 1001"):
        process.check_ptrace_allowed(st, 1001, 0, 4242)
    process.check_ptrace_allowed(st, 1001, 1 << process.CAP_SYS_PTRACE, 4242)  # root-like
    monkeypatch.setattr(process, "ptrace_scope", lambda: 1)
    with pytest.raises(PermissionDenied, match="ptrace_scope=1") as err:
        process.check_ptrace_allowed(st, 1000, 0, 4242)
    assert "sysctl kernel.yama.ptrace_scope=0" in err.value.hint
    monkeypatch.setattr(process, "ptrace_scope", lambda: 3)
    with pytest.raises(PermissionDenied, match="ptrace_scope=3"):
        process.check_ptrace_allowed(st, 0, 1 << process.CAP_SYS_PTRACE, 4242)


def test_permission_hint_names_docker_and_sysctl() -> None:
    hint = process.permission_hint(1, container=True)
    assert "--cap-add=SYS_PTRACE" in hint and "kernel.yama.ptrace_scope" in hint


def test_inspect_live_processes() -> None:
    me = process.inspect(os.getpid())
    assert me.version is not None and me.uid == os.geteuid() and me.root == "/"
    with pytest.raises(ProcessNotFound, match="no process with pid"):
        process.inspect(2**22 + 12345)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(NotPython, match="not a CPython interpreter"):
            process.inspect(sleeper.pid)
        os.kill(sleeper.pid, 19)  # SIGSTOP
        import time

        time.sleep(0.1)
        # the version check comes first for a non-Python process
        with pytest.raises(NotPython):
            process.inspect(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_thread_id_is_not_a_process(spawn_target) -> None:
    from flight_profiler.errors import UsageError

    t = spawn_target("import threading, time\n"
                     "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                     "print('READY', flush=True)\ntime.sleep(60)\n")
    tids = [int(x) for x in os.listdir(f"/proc/{t.pid}/task") if int(x) != t.pid]
    with pytest.raises(UsageError, match=f"is a thread of process {t.pid}"):
        process.inspect(tids[0])


def test_stopped_and_traced_python_targets(spawn_target) -> None:
    t = spawn_target("import time\nprint('READY', flush=True)\ntime.sleep(60)\n")
    os.kill(t.pid, 19)  # SIGSTOP
    try:
        import time

        time.sleep(0.1)
        with pytest.raises(AttachFailed, match=r"is stopped \(state T\)") as err:
            process.inspect(t.pid)
        assert f"kill -CONT {t.pid}" in err.value.hint
    finally:
        os.kill(t.pid, 18)  # SIGCONT
    # a tracer that only seizes (the target runs on) and lets go when it exits
    seize = (f"import ctypes, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             f"assert libc.ptrace(0x4206, {t.pid}, None, None) == 0, ctypes.get_errno()\n"
             "time.sleep(1.5)\n")
    tracer = subprocess.Popen([sys.executable, "-c", seize], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        import time

        deadline = time.monotonic() + 10
        status = Path(f"/proc/{t.pid}/status")
        while process.parse_status(status.read_text()).tracer_pid == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # the pre-flight reports the tracer; only an injection is refused (an agent already
        # running would answer on its socket whoever traces the process)
        assert process.inspect(t.pid).tracer_pid == tracer.pid
        from flight_profiler import api

        with pytest.raises(AttachFailed, match=r"already traced by PID \d+ \(a debugger\?\)"):
            api.connect(t.pid, timeout=2)
    finally:
        tracer.wait(30)
    assert t.alive()


def test_root_without_cap_sys_ptrace_is_told_about_the_capability_not_the_uid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN pid 1 of a container (root, full capabilities) and a root caller whose
    # capabilities were dropped (no CAP_SYS_PTRACE)
    monkeypatch.setattr(process, "ptrace_scope", lambda: 0)
    init = process.parse_status(STATUS.replace("1000", "0") + "CapPrm:\t000001ffffffffff\n")
    caller_caps = 0x00000000a80425fb  # Docker's default set: no CAP_SYS_PTRACE (bit 19)
    assert not caller_caps & (1 << process.CAP_SYS_PTRACE)
    # WHEN the pre-flight runs THEN the error names the capability and the Docker fix
    with pytest.raises(PermissionDenied) as err:
        process.check_ptrace_allowed(init, 0, caller_caps, 1)
    assert "CAP_SYS_PTRACE" in err.value.message and "uid" not in err.value.message
    assert "--cap-add=SYS_PTRACE" in err.value.hint
    # a plain user attaching to a target holding capabilities is told so, not about a uid
    user = process.parse_status(STATUS + "CapPrm:\t0000000000080000\n")
    with pytest.raises(PermissionDenied, match="capabilities you lack"):
        process.check_ptrace_allowed(user, 1000, 0, 4242)
    # and with the capability, both are allowed
    process.check_ptrace_allowed(init, 0, caller_caps | (1 << process.CAP_SYS_PTRACE), 1)


def test_a_refusal_for_a_process_of_our_own_uid_names_the_capability(monkeypatch) -> None:
    # GIVEN our own process, whose /proc entries the kernel nevertheless refuses (as it does for
    # a container's init seen from another user namespace)
    def refused(path: str) -> str:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "readlink", refused)
    # WHEN it is inspected, THEN the error does not blame a uid mismatch
    with pytest.raises(PermissionDenied) as err:
        process.inspect(os.getpid())
    assert "you (uid" not in err.value.message
    assert "CAP_SYS_PTRACE" in err.value.message
