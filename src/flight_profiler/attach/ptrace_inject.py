"""Inject the bootstrap with our own ptrace calls: no gdb, no compiler, no file the target loads.

The safe shape measured in ../shared/design/injection.md, done by ``ptrace.Tracee``:

0. refuse, before touching anything, a target whose seccomp sandbox would kill it for one of
   the calls below (attach/seccomp.py), and pin the process the pre-flight saw (a pidfd and its
   /proc directory, attach/identity.py): checked after the seize and before every write;
1. stop only the main thread and save its complete state; every call from here on returns
   through ``rt_sigreturn`` with a frame of that state, so a CLI killed at any instant leaves
   the thread whole (attach/sigframe.py);
2. ``mmap`` one private read+exec region (a thin wrapper of the system call: it returns into
   libc's own ``rt_sigreturn``, the only code there is yet). Its first page holds the stub every
   later call returns into (it keeps the result and puts ``errno`` back); the rest two tiny
   x86-64 routines, their table of addresses, and the two bootstrap texts, written through
   /proc/PID/mem. The target's malloc is never called from the borrowed thread unless it is
   parked in a system call;
3. ``errno`` is read (restored at the end, and by the stub after each call); ``PyGILState_Check()``:
   does it hold the GIL? ``orig_rax``: is it parked in a system call?
4. parked without the GIL: ``PyThread_start_new_thread(thread_main, table)``: a new native thread
   takes the GIL itself (we never wait for it), runs the bootstrap, releases the GIL and unmaps
   the routines and texts as its last act (a tail call, so it never returns into unmapped code);
5. otherwise: queue ``pending_main(table)`` as a pending call (3.12+: on the main interpreter,
   so any thread running Python serves it); it runs the bootstrap, then unmaps them;
6. unmap the stub's page, restore every register, the XSAVE area and the signal mask, detach.
   The routines stay only while a queued call has not run.
"""

from __future__ import annotations

import errno
import os
import re
import struct
import time

from flight_profiler.attach import elf_symbols, identity, ptrace, seccomp, sigframe
from flight_profiler.attach.outcome import Outcome
from flight_profiler.attach.process import TargetInfo, in_container, permission_hint, ptrace_scope
from flight_profiler.errors import AttachFailed, PermissionDenied, ProcessNotFound, already_traced

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Callable

PROT_READ, PROT_EXEC = 1, 4
MAP_PRIVATE, MAP_ANONYMOUS = 2, 0x20
SYS_MMAP, SYS_MUNMAP = 9, 11
_PAGE = 4096
STUB_SIZE = _PAGE  # the stub's own page, before the routines: freed by us, not by them
_LIBPYTHON = re.compile(r"/libpython3\.\d+[a-z]*\.so")

THREAD_OFF = 0x00
PENDING_OFF = 0x80
TABLE_OFF = 0x100
TEXT_OFF = 0x200

# Table (8-byte slots, at TABLE_OFF): the routines below read only these.
(_ENSURE, _RUN, _RELEASE, _INITIALIZED, _MUNMAP, _BASE, _SIZE, _FOREIGN, _PENDING,
 _SIGPROCMASK) = range(10)
MASK_OFF = 0x80  # in the table: a sigset_t (128 bytes), the borrowed thread's own signal mask

# void thread_main(table *t): started by PyThread_start_new_thread.
#   push rbx; mov rbx, rdi
#   mov edi, 2; lea rsi, [rbx+0x80]; xor edx, edx; call [rbx+0x48]
#     (sigprocmask(SIG_SETMASK, mask, NULL): the new thread inherited the mask the main thread
#     runs our calls with, all but the fault signals blocked; it takes the main thread's own)
#   call [rbx+0x18] (Py_IsInitialized); test eax, eax; jz out
#   call [rbx] (PyGILState_Ensure); push rax; sub rsp, 8
#   mov rdi, [rbx+0x38]; xor esi, esi; call [rbx+8] (PyRun_SimpleString[Flags](text, NULL))
#   add rsp, 8; pop rdi; call [rbx+0x10] (PyGILState_Release(state))
# out:
#   mov rdi, [rbx+0x28]; mov rsi, [rbx+0x30]; mov rax, [rbx+0x20]; pop rbx
#   jmp rax (munmap(base, size) returns straight to our caller, outside the region)
# The stack is 16-byte aligned at every call (entry rsp = 8 mod 16; push rbx makes it 0).
THREAD_MAIN = bytes.fromhex(
    "53" "4889fb"
    "bf02000000" "488db380000000" "31d2" "ff5348"
    "ff5318" "85c0" "7418"
    "ff13" "50" "4883ec08"
    "488b7b38" "31f6" "ff5308"
    "4883c408" "5f" "ff5310"
    "488b7b28" "488b7330" "488b4320" "5b" "ffe0"
)
# int pending_main(table *t): run as a pending call; returns munmap's 0 (success).
#   push rbx; mov rbx, rdi; mov rdi, [rbx+0x40]; xor esi, esi; call [rbx+8]
#   mov rdi, [rbx+0x28]; mov rsi, [rbx+0x30]; mov rax, [rbx+0x20]; pop rbx; jmp rax
PENDING_MAIN = bytes.fromhex(
    "53" "4889fb" "488b7b40" "31f6" "ff5308"
    "488b7b28" "488b7330" "488b4320" "5b" "ffe0"
)

_PY_FUNCS = ("Py_IsInitialized", "PyGILState_Ensure", "PyGILState_Release", "PyGILState_Check",
             "PyRun_SimpleString", "PyRun_SimpleStringFlags", "PyThread_start_new_thread",
             "Py_AddPendingCall", "_PyEval_AddPendingCall", "PyInterpreterState_Main")
_C_FUNCS = ("mmap", "munmap", "__errno_location", "sigprocmask")


def build_region(base: int, funcs: dict[str, int], foreign_text: str,
                 pending_text: str, sigmask: int = 0) -> bytes:
    """The bytes of the injected region, for a region mapped at ``base``; ``sigmask``: the
    borrowed thread's own signal mask, which the thread it starts takes."""
    foreign = _cstr(foreign_text)
    pending = _cstr(pending_text)
    size = region_size(foreign_text, pending_text)
    run = funcs.get("PyRun_SimpleString") or funcs["PyRun_SimpleStringFlags"]
    table = [0] * 10
    table[_ENSURE] = funcs["PyGILState_Ensure"]
    table[_RUN] = run
    table[_RELEASE] = funcs["PyGILState_Release"]
    table[_INITIALIZED] = funcs["Py_IsInitialized"]
    table[_MUNMAP] = funcs["munmap"]
    table[_BASE] = base
    table[_SIZE] = size
    table[_FOREIGN] = base + TEXT_OFF
    table[_PENDING] = base + TEXT_OFF + len(foreign)
    table[_SIGPROCMASK] = funcs["sigprocmask"]
    region = bytearray(TEXT_OFF)
    region[THREAD_OFF:THREAD_OFF + len(THREAD_MAIN)] = THREAD_MAIN
    region[PENDING_OFF:PENDING_OFF + len(PENDING_MAIN)] = PENDING_MAIN
    region[TABLE_OFF:TABLE_OFF + 80] = struct.pack("<10Q", *table)
    region[TABLE_OFF + MASK_OFF:TABLE_OFF + MASK_OFF + 8] = struct.pack("<Q", sigmask)
    return bytes(region) + foreign + pending


def region_size(foreign_text: str, pending_text: str) -> int:
    n = TEXT_OFF + len(_cstr(foreign_text)) + len(_cstr(pending_text))
    return (n + _PAGE - 1) // _PAGE * _PAGE


def _cstr(text: str) -> bytes:
    data = text.encode("utf-8")
    if b"\0" in data:
        raise ValueError("bootstrap text contains a NUL byte")
    return data + b"\0"


def resolve_functions(target: TargetInfo) -> dict[str, int]:
    """Addresses of the C-API and libc functions the injection calls, or AttachFailed."""
    try:
        with open(f"/proc/{target.pid}/maps") as f:
            maps = elf_symbols.parse_maps(f.read())
    except FileNotFoundError:
        raise ProcessNotFound(f"process {target.pid} exited") from None
    objects = elf_symbols.loaded_objects(maps)
    try:
        libc = elf_symbols.find_libc(objects)
        funcs = elf_symbols.resolve(target.pid, libc, list(_C_FUNCS), target.root)
        exe = target.exe.removesuffix(" (deleted)")
        candidates = [objects[exe]] if exe in objects else []
        candidates += [o for p, o in objects.items() if _LIBPYTHON.search(p) and p != exe]
        py: dict[str, int] = {}
        where = "its executable"
        for obj in candidates:
            py = elf_symbols.resolve(target.pid, obj, list(_PY_FUNCS), target.root)
            if "PyGILState_Ensure" in py:
                where = obj.path
                break
    except elf_symbols.SymbolError as exc:
        raise AttachFailed(f"cannot find the functions to call in process {target.pid}: {exc}",
                           "rerun with -v; as a fallback try --method gdb") from None
    funcs.update(py)
    needed = ["Py_IsInitialized", "PyGILState_Ensure", "PyGILState_Release", "PyGILState_Check",
              "PyThread_start_new_thread", *_C_FUNCS]
    needed += (["_PyEval_AddPendingCall", "PyInterpreterState_Main"]
               if target.version and target.version >= (3, 12) else ["Py_AddPendingCall"])
    missing = [n for n in needed if n not in funcs]
    if "PyRun_SimpleString" not in funcs and "PyRun_SimpleStringFlags" not in funcs:
        missing.append("PyRun_SimpleString")
    if missing:
        raise AttachFailed(
            f"process {target.pid} does not export the CPython C API functions "
            f"{', '.join(missing)} (looked in {where})",
            "is it an embedded interpreter built without exported symbols? rerun with -v",
        )
    return funcs


def _tasks(pid: int) -> set[int]:
    try:
        return {int(n) for n in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


def inject(target: TargetInfo, foreign_text: str, pending_text: str,
           say: Callable[[str], None] = lambda s: None, call_timeout: float = 5.0,
           pin: identity.Pin | None = None) -> Outcome:
    """Run the recipe once. Does not wait for the agent. ``pin``: the process as the pre-flight
    saw it (pinned here when not given)."""
    started = time.monotonic()
    own_pin = pin is None
    pin = pin or identity.Pin(target)
    try:
        status = sandbox_verdict(target, say)
        funcs = resolve_functions(target)
        say("resolved " + ", ".join(f"{k}={v:#x}" for k, v in sorted(funcs.items())))
        size = region_size(foreign_text, pending_text)
        outcome = Outcome(method="none")
        tracee = ptrace.Tracee(target.pid, check=pin.check)
        try:
            _seized(tracee, target, status, funcs, size, foreign_text, pending_text, outcome,
                    call_timeout, say)
        finally:
            for line in tracee.log:
                say(line)
    finally:
        if own_pin:
            pin.close()
    outcome.elapsed = time.monotonic() - started
    outcome.values["held_signals"] = ",".join(str(s) for s in tracee.held_signals) or "none"
    for key, value in outcome.values.items():
        say(f"ptrace: {key}={value}")
    return outcome


def sandbox_verdict(target: TargetInfo, say: Callable[[str], None]) -> seccomp.Status:
    """Refuse a target whose seccomp sandbox would kill it for the injection's calls, before
    anything is done to it (the filters are read in a stop of their own)."""
    status = seccomp.parse_status(read_status(target.pid))
    seccomp.check_status(target.pid, status)
    if status.mode == 2 and ptrace.stuck_in_disk_sleep(target.pid, target.pid):
        raise _attach_error(target.pid, ptrace.PtraceError(
            "the main thread is in uninterruptible sleep (disk or network file system I/O)",
            errno.EBUSY))
    probe = seccomp.probe_in_child if seccomp.same_sandbox(target.pid, status) else None
    say(seccomp.check_filters(target.pid, status,
                              lambda: seccomp.read_filters_briefly(target.pid, status.filters),
                              probe))
    return status


def read_status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        raise ProcessNotFound(f"process {pid} exited") from None


def _seized(tracee: ptrace.Tracee, target: TargetInfo, status: seccomp.Status,
            funcs: dict[str, int], size: int, foreign_text: str, pending_text: str,
            outcome: Outcome, call_timeout: float, say: Callable[[str], None]) -> None:
    try:
        with ptrace.signals_held():
            try:
                tracee.attach()
            except ptrace.PtraceError as exc:
                raise _attach_error(target.pid, exc) from None
            try:
                now = seccomp.parse_status(read_status(target.pid))
                if now != status:  # a filter added meanwhile: judged again, held as we are
                    seccomp.check_status(target.pid, now)
                    say(seccomp.check_filters(
                        target.pid, now, lambda: seccomp.read_filters(tracee.tid, now.filters),
                        seccomp.probe_in_child if seccomp.same_sandbox(target.pid, now) else None))
                _borrow(tracee, target, funcs, size, foreign_text, pending_text, outcome,
                        call_timeout)
            finally:
                tracee.detach()
    except ptrace.TargetExited:
        raise ProcessNotFound(f"process {target.pid} exited during attach") from None
    except ptrace.CallTimeout as exc:
        raise AttachFailed(
            f"a call into process {target.pid} did not return ({exc}); it was abandoned and "
            "the thread's state restored", "the main thread may be inside the allocator or a "
            "lock; retry in a moment") from None
    except ptrace.CallCrashed as exc:
        raise AttachFailed(f"a call into process {target.pid} faulted ({exc}); its state was "
                           "restored and the signal discarded",
                           "please report this with `-v` output; try --method gdb") from None
    except ptrace.PtraceError as exc:
        hint = "retry in a moment" if exc.errno in (errno.ENOSPC, errno.EAGAIN) else \
            "rerun with -v"
        raise AttachFailed(f"ptrace failed on process {target.pid}: {exc}", hint) from None


def _borrow(t: ptrace.Tracee, target: TargetInfo, funcs: dict[str, int], size: int,
            foreign_text: str, pending_text: str, outcome: Outcome, timeout: float) -> None:
    outcome.syscall = t.syscall
    outcome.values["syscall"] = str(t.syscall)
    outcome.values["rax"] = str(ptrace.signed(t.saved.rax))
    base = t.call(funcs["mmap"], 0, STUB_SIZE + size, PROT_READ | PROT_EXEC,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, timeout=timeout, syscall=SYS_MMAP)
    if ptrace.signed(base) < 0 or base % _PAGE:
        raise AttachFailed(f"could not map memory in process {target.pid} "
                           f"(mmap returned {ptrace.signed(base)})", "rerun with -v")
    region = base + STUB_SIZE
    outcome.values["region"] = f"{region:#x}+{size}"
    outcome.values["stub"] = f"{base:#x}+{STUB_SIZE}"
    t.write(base, sigframe.STUB)
    t.write(region, build_region(region, funcs, foreign_text, pending_text, t.sigmask))
    t.stub = base
    errno_addr = t.call(funcs["__errno_location"], timeout=timeout)
    saved_errno = t.read(errno_addr, 4)
    # value first: the stub writes errno back once it sees the address
    t.write(base + sigframe.ERRNO_VALUE, saved_errno)
    t.write(base + sigframe.ERRNO_ADDR, struct.pack("<Q", errno_addr))
    outcome.holds_gil = (t.call(funcs["PyGILState_Check"], timeout=timeout) & 0xFFFFFFFF) != 0
    outcome.values["gil"] = str(int(outcome.holds_gil))
    table = region + TABLE_OFF
    if outcome.syscall >= 0 and not outcome.holds_gil:
        before = _tasks(target.pid)
        try:
            ident = t.call(funcs["PyThread_start_new_thread"], region + THREAD_OFF, table,
                           timeout=timeout)
        except ptrace.CallTimeout as exc:
            # Its first act is a malloc: a main thread stopped inside the allocator (a system
            # call under the arena lock) blocks it for good, most likely there, before it took
            # anything. The call was abandoned; the pending call below needs no allocator.
            ident = 0
            outcome.helper_error = (f"PyThread_start_new_thread did not return ({exc}; the main "
                                    "thread was probably inside the allocator)")
        if ident not in (0, (1 << 64) - 1):
            outcome.method = "thread"
            # its tid, so that a timeout can say what that thread is doing instead of guessing
            new = sorted(_tasks(target.pid) - before)
            if len(new) == 1:
                outcome.values["agent_tid"] = str(new[0])
        elif outcome.helper_error is None:
            outcome.helper_error = "PyThread_start_new_thread failed in the target"
    if outcome.method == "none":
        if target.version and target.version >= (3, 12):
            interp = t.call(funcs["PyInterpreterState_Main"], timeout=timeout)
            rc = t.call(funcs["_PyEval_AddPendingCall"], interp, region + PENDING_OFF, table, 0,
                        timeout=timeout)
        else:
            rc = t.call(funcs["Py_AddPendingCall"], region + PENDING_OFF, table,
                        timeout=timeout)
        rc32 = rc & 0xFFFFFFFF
        outcome.values["pending_rc"] = str(rc32 - (1 << 32) if rc32 >> 31 else rc32)
        if rc32 == 0:
            outcome.method = "pending"
        else:
            t.call(funcs["munmap"], region, size, timeout=timeout)
    t.stub = None
    t.call(funcs["munmap"], base, STUB_SIZE, timeout=timeout, syscall=SYS_MUNMAP)
    t.write(errno_addr, saved_errno)
    if outcome.method == "none":
        raise AttachFailed(f"the pending-call queue of process {target.pid} is full",
                           "retry in a moment")


def _attach_error(pid: int, exc: ptrace.PtraceError) -> Exception:
    if exc.errno == errno.ESRCH:
        return ProcessNotFound(f"process {pid} exited during attach")
    if exc.errno == errno.EPERM:
        try:
            with open(f"/proc/{pid}/status") as f:
                tracer = int(f.read().split("TracerPid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            tracer = 0
        if tracer and tracer != os.getpid():
            return already_traced(pid, tracer)
        return PermissionDenied(f"the kernel refused to let flight_profiler trace process {pid}",
                                permission_hint(ptrace_scope(), in_container()))
    if exc.errno == errno.EBUSY:
        return AttachFailed(f"cannot attach to process {pid} now: {exc.what}",
                            "retry when its I/O completes")
    if exc.errno == errno.EAGAIN:
        return AttachFailed(f"cannot attach to process {pid} now: {exc.what}",
                            "retry in a moment")
    return AttachFailed(f"ptrace could not attach to process {pid}: {exc}", "rerun with -v")
