"""The seccomp verdict (attach/seccomp.py): /proc parsing, the classic-BPF evaluator checked
against the kernel's own answers, and which filters refuse an attach."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from flight_profiler.attach import ptrace, seccomp
from flight_profiler.errors import AttachFailed, ExitCode

pytestmark = pytest.mark.skipif(not ptrace.supported(), reason="x86-64 Linux only")

# cBPF opcodes
LD_W_ABS, JEQ_K, JSET_K, JGT_K, JGE_K, RET_K, RET_A = 0x20, 0x15, 0x45, 0x25, 0x35, 0x06, 0x16
ALU_AND_K, ALU_OR_K, ALU_ADD_K, ALU_RSH_K, TAX, TXA, ST, LDX_MEM, JA = (
    0x54, 0x44, 0x04, 0x74, 0x07, 0x87, 0x02, 0x61, 0x05)
NR, ARCH, ARG0, ARG1, ARG2 = 0, 4, 16, 24, 32


def asm(*insns: tuple[int, int, int, int]) -> bytes:
    return b"".join(struct.pack("<HBBI", *i) for i in insns)


def kill_on(nr: int, action: int = seccomp.RET_KILL_PROCESS, arg_bit: tuple[int, int] | None = None
            ) -> bytes:
    """A libseccomp-shaped filter: x86-64 only; ``nr`` (when ``arg_bit`` = (offset, bits):
    only with those bits set in that argument) gets ``action``; everything else is allowed."""
    prog = [(LD_W_ABS, 0, 0, ARCH), (JEQ_K, 1, 0, seccomp.AUDIT_ARCH_X86_64),
            (RET_K, 0, 0, seccomp.RET_KILL_PROCESS), (LD_W_ABS, 0, 0, NR)]
    if arg_bit is None:
        prog += [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, action)]
    else:
        prog += [(JEQ_K, 0, 3, nr), (LD_W_ABS, 0, 0, arg_bit[0]), (JSET_K, 0, 1, arg_bit[1]),
                 (RET_K, 0, 0, action)]
    prog.append((RET_K, 0, 0, seccomp.RET_ALLOW))
    return asm(*prog)


def test_status_lines_are_read() -> None:
    text = ("Name:\tpython\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n"
            "x86_Thread_features:\tshstk wrss\n")
    assert seccomp.parse_status(text) == seccomp.Status(2, 3, True)
    assert seccomp.parse_status("Seccomp:\t0\n") == seccomp.Status(0, -1, False)
    assert seccomp.parse_status("Name: x\n") == seccomp.Status(-1, -1, False)


def test_a_filter_that_kills_exec_mappings_is_named_with_the_call() -> None:
    prog = kill_on(9, arg_bit=(ARG2, 4))  # mmap with PROT_EXEC
    assert seccomp.deadly_call([prog]) == ("mmap(PROT_READ|PROT_EXEC)", "kill the process")
    # a data mapping passes the same filter
    assert seccomp.verdict([prog], 9, (0, 4096, 3, 0x22)) == seccomp.RET_ALLOW


def test_filters_that_refuse_politely_are_no_danger() -> None:
    errno_clone3 = kill_on(435, seccomp.RET_ERRNO | 38)  # Docker's clone3 -> ENOSYS
    assert seccomp.deadly_call([errno_clone3]) is None
    assert seccomp.deadly_call([kill_on(56, seccomp.RET_TRAP)]) == ("clone (a thread)",
                                                                     "send it SIGSYS")
    assert seccomp.deadly_call([kill_on(41, seccomp.RET_USER_NOTIF)])[0] == "socket(AF_UNIX)"  # type: ignore[index]


def test_the_most_restrictive_of_several_filters_wins() -> None:
    logs = kill_on(9, seccomp.RET_LOG)
    kills = kill_on(9, seccomp.RET_KILL_THREAD)
    errs = kill_on(9, seccomp.RET_ERRNO | 1)
    assert seccomp.verdict([logs, errs], 9, ()) == seccomp.RET_ERRNO | 1
    assert seccomp.verdict([errs, kills, logs], 9, ()) == seccomp.RET_KILL_THREAD
    assert seccomp.verdict([logs, kill_on(9)], 9, ()) == seccomp.RET_KILL_PROCESS


def _kernel_errno(prog: bytes, nr: int, args: tuple[int, ...]) -> int:
    """The errno the kernel gives ``syscall(nr, *args)`` under ``prog`` (in a forked child)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            buf = ctypes.create_string_buffer(prog)

            class Prog(ctypes.Structure):
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

            fprog = Prog(len(prog) // 8, ctypes.addressof(buf))
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
                os._exit(99)
            libc.syscall.restype = ctypes.c_long
            rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a) for a in args))
            err = ctypes.get_errno() if rc == -1 else 0
            os.write(w, struct.pack("<i", err))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and len(data) == 4, status
    return int(struct.unpack("<i", data)[0])


def test_the_evaluator_answers_what_the_kernel_answers() -> None:
    # GIVEN filters using loads of both argument halves, arithmetic, the scratch memory, X and
    # every jump, answering with an errno computed from the arguments (getppid ignores them)
    progs = [
        asm((LD_W_ABS, 0, 0, NR), (JEQ_K, 0, 5, 110), (LD_W_ABS, 0, 0, ARG0),
            (ALU_AND_K, 0, 0, 0xFF), (ALU_ADD_K, 0, 0, 1), (ALU_OR_K, 0, 0, seccomp.RET_ERRNO),
            (RET_A, 0, 0, 0), (RET_K, 0, 0, seccomp.RET_ALLOW)),
        asm((LD_W_ABS, 0, 0, ARG1 + 4), (JGT_K, 1, 0, 5), (JA, 0, 0, 2),
            (LD_W_ABS, 0, 0, ARG1), (JGE_K, 2, 0, 100), (RET_K, 0, 0, seccomp.RET_ERRNO | 7),
            (RET_K, 0, 0, seccomp.RET_ALLOW), (RET_K, 0, 0, seccomp.RET_ERRNO | 9)),
        asm((LD_W_ABS, 0, 0, ARG2), (ALU_RSH_K, 0, 0, 4), (ST, 0, 0, 3), (TAX, 0, 0, 0),
            (LDX_MEM, 0, 0, 3), (TXA, 0, 0, 0), (JSET_K, 0, 1, 0x3), (RET_K, 0, 0, seccomp.RET_ERRNO | 11),
            (RET_K, 0, 0, seccomp.RET_ERRNO | 12)),
    ]
    cases = [(0, 0, 0), (5, 50, 0x10), (0x1FF, 200, 0x30), (3, (6 << 32) | 1, 0x20),
             (0, (2 << 32) | 150, 0)]
    # only getppid is judged: the child must still write its answer and exit
    only_getppid = asm((LD_W_ABS, 0, 0, NR), (JEQ_K, 1, 0, 110), (RET_K, 0, 0, seccomp.RET_ALLOW))
    for prog in (only_getppid + p for p in progs):
        for args in cases:
            # WHEN one syscall runs under each in a child
            ours = seccomp.verdict([prog], 110, args)
            want = ours & 0xFFFF if ours & 0xFFFF0000 == seccomp.RET_ERRNO else 0
            # THEN the kernel's errno is ours
            assert _kernel_errno(prog, 110, args) == want, (prog.hex(), args)


def test_strict_mode_and_shadow_stacks_are_refused_before_any_ptrace() -> None:
    with pytest.raises(AttachFailed, match="strict mode") as info:
        seccomp.check_status(7, seccomp.Status(1, 0, False))
    assert info.value.exit_code == ExitCode.ATTACH_FAILED
    with pytest.raises(AttachFailed, match="shadow stack"):
        seccomp.check_status(7, seccomp.Status(0, 0, True))
    seccomp.check_status(7, seccomp.Status(2, 1, False))  # filters: decided once attached


def test_unreadable_filters_are_refused_unless_shared_and_probed() -> None:
    status = seccomp.Status(2, 1, False)

    def unreadable() -> list[bytes]:
        raise OSError(13, "Permission denied")

    with pytest.raises(AttachFailed, match="cannot be read") as info:
        seccomp.check_filters(7, status, unreadable)
    assert "root" in info.value.hint
    with pytest.raises(AttachFailed, match="clone"):
        seccomp.check_filters(7, status, unreadable, probe=lambda: "clone(a_thread) (signal 31)")
    assert "test child" in seccomp.check_filters(7, status, unreadable, probe=lambda: None)
    with pytest.raises(AttachFailed, match="would kill the process for mmap"):
        seccomp.check_filters(7, status, lambda: [kill_on(9, arg_bit=(ARG2, 4))])
    assert "allow" in seccomp.check_filters(7, status, lambda: [kill_on(169)])  # reboot
    assert seccomp.check_filters(7, seccomp.Status(0, 0, False), unreadable) == "no seccomp filter"


def test_the_probe_child_reports_the_call_that_killed_it() -> None:
    # this test process runs under no filter: the probe comes through
    assert seccomp.probe_in_child() is None


def test_a_sandboxed_target_in_uninterruptible_sleep_is_refused_before_any_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from flight_profiler.attach import ptrace_inject

    # GIVEN a filtered process whose main thread is in D state (NFS, a disk hang): the stop its
    # filters are read in would never come
    monkeypatch.setattr(ptrace_inject, "read_status",
                        lambda pid: "Seccomp:\t2\nSeccomp_filters:\t1\n")
    monkeypatch.setattr(ptrace, "thread_state", lambda pid, tid: "D")
    monkeypatch.setattr(ptrace, "D_PATIENCE_S", 0.05)

    def no_stop(*a: object) -> object:
        raise AssertionError("the filters were read in a stop")

    monkeypatch.setattr(seccomp, "read_filters_briefly", no_stop)
    monkeypatch.setattr(seccomp, "check_filters", no_stop)
    # WHEN the injector judges its sandbox
    with pytest.raises(AttachFailed) as err:
        ptrace_inject.sandbox_verdict(SimpleNamespace(pid=4242), lambda s: None)  # type: ignore[arg-type]
    # THEN one line says why and when to retry, exit 6, and it was never stopped
    assert "uninterruptible sleep" in str(err.value) and err.value.exit_code == ExitCode.ATTACH_FAILED
    assert "retry when its I/O completes" in err.value.hint


def test_a_thread_passing_through_disk_sleep_is_not_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CUDA job's main thread is in "D" for moments inside the driver's ioctls (one look
    # refused an attach on an H100): only a thread that stays there is stuck.
    looks = iter(["D", "D", "D", "S"])
    monkeypatch.setattr(ptrace, "thread_state", lambda pid, tid: next(looks, "S"))
    assert ptrace.stuck_in_disk_sleep(4242, 4242, patience=1.0) is False
    monkeypatch.setattr(ptrace, "thread_state", lambda pid, tid: "D")
    assert ptrace.stuck_in_disk_sleep(4242, 4242, patience=0.05) is True
