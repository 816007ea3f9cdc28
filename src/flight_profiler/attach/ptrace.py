"""Borrow one thread of a live process over ptrace and call functions in it (x86-64 Linux).

ctypes over libc only: no compiler, no gdb. The recipe was measured on this project's machines
(../shared/design/injection.md); each step has its reason:

- PTRACE_SEIZE + PTRACE_INTERRUPT, not PTRACE_ATTACH: no SIGSTOP is queued, and the other
  threads keep running (they may hold locks our calls need).
- The COMPLETE state is saved first and written back before detaching: the general registers
  (``orig_rax``/``rax`` carry the syscall-restart state), the whole XSAVE area whatever its
  size (gdb 13 cannot write it back, which killed targets), the signal mask.
- Every call undoes itself if this process vanishes at any instant: a signal frame of the saved
  state is written below the red zone before any register changes, and each call returns into
  ``rt_sigreturn`` with it (attach/sigframe.py). With the tracer alive the thread stops at that
  system call's entry (PTRACE_SYSCALL), which is skipped; the state is restored with ptrace at
  an interrupt stop, where the kernel restarts the interrupted system call as it would have.
- All but the fault signals are blocked in the thread during our calls: they stay pending and
  are delivered once its own mask is back, either way. A signal whose delivery our first stop
  interrupted is requeued with its siginfo.
- SIGINT/SIGTERM to the CLI are blocked while the thread is borrowed (``signals_held``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flight_profiler.attach import sigframe
from flight_profiler.attach.regs import Regs
from flight_profiler.attach.steps import step as _step

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Callable

PTRACE_CONT = 7
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_SYSCALL = 24
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_GETSIGMASK = 0x420A
PTRACE_SETSIGMASK = 0x420B
PTRACE_O_TRACESYSGOOD = 1
PTRACE_EVENT_STOP = 128
NT_PRFPREG = 2
NT_X86_XSTATE = 0x202
WALL = 0x40000000
SYSCALL_STOP = signal.SIGTRAP | 0x80  # PTRACE_O_TRACESYSGOOD: never a real signal number

# Far larger than any XSAVE layout the kernel reports today (11008 bytes with AMX).
_XSTATE_BUFFER = 1 << 16
_RED_ZONE_GAP = 256
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                            signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS})
# Blocked in the thread during our calls: every signal but the faults our call could raise
# (a blocked fault signal would be forced through and the process' handler reset to default).
_BLOCKED_DURING_CALLS = ((1 << 64) - 1) & ~sum(1 << (s - 1) for s in _CRASH_SIGNALS)
_U64 = (1 << 64) - 1

def supported() -> bool:
    """Whether this machine can use the own injector (the kernel ABI here is x86-64's)."""
    # os.uname(): what platform.system() and .machine() read, without importing platform
    uname = os.uname()
    return uname.sysname == "Linux" and uname.machine in ("x86_64", "amd64")


class PtraceError(Exception):
    """A ptrace step failed; ``errno`` says why (EPERM: not allowed, ESRCH: gone)."""

    def __init__(self, what: str, err: int) -> None:
        super().__init__(f"{what}: {os.strerror(err)}")
        self.what = what
        self.errno = err


class CallTimeout(Exception):
    """A call into the target did not return in time; it was abandoned and the state restored."""


class CallCrashed(Exception):
    """A call into the target faulted; the thread's state was restored, the signal discarded."""


class TargetExited(Exception):
    """The process ended while it was being worked on."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        lib.ptrace.restype = ctypes.c_long
        _libc = lib
    return _libc


def _ptrace(request: int, pid: int, addr: int | None, data: int | ctypes._CData | None,
            what: str) -> int:
    _step(what)
    ctypes.set_errno(0)
    if isinstance(data, (ctypes._SimpleCData, ctypes.Structure)):
        data_arg: object = ctypes.addressof(data)
    else:
        data_arg = data
    rc = int(_lib().ptrace(request, pid, addr, data_arg))
    if rc == -1:
        err = ctypes.get_errno()
        if err:
            raise PtraceError(what, err)
    return rc


def thread_state(pid: int, tid: int) -> str:
    """The kernel's one-letter state of a thread ("R", "S", "D", ...), "?" if unreadable."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


# A GPU job's main thread passes through uninterruptible sleep inside the driver many times a
# second (ioctl waits: seen on an H100, where one look at a CUDA job refused the attach); I/O
# that really blocks stays there. So a thread counts as stuck in "D" only if it stays there.
D_PATIENCE_S = 2.0


def stuck_in_disk_sleep(pid: int, tid: int, patience: float | None = None) -> bool:
    """Whether the thread is in uninterruptible sleep at every look over ``patience`` seconds
    (D_PATIENCE_S by default)."""
    deadline = time.monotonic() + (D_PATIENCE_S if patience is None else patience)
    while thread_state(pid, tid) == "D":
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.005)
    return False


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP/SIGQUIT for the caller while a thread of the target is borrowed.

    They are delivered when the block ends, after the target was restored and detached.
    """
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL:
        held.add(signal.SIGCHLD)  # each stop of the tracee is then waited for, not polled
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Tracee:
    """One stopped thread of a process, with its complete saved state.

    Use as a context manager: ``__exit__`` restores the saved state and detaches on every path.
    ``check`` (the process' identity, attach/identity.py) runs after the seize and before
    every write into the target.
    """

    def __init__(self, pid: int, tid: int | None = None, stop_timeout: float = 5.0,
                 check: Callable[[], None] | None = None) -> None:
        self.pid = pid
        self.tid = tid if tid is not None else pid
        self.stop_timeout = stop_timeout
        self.check = check or (lambda: None)
        self.held_signals: list[int] = []  # signals whose delivery we postponed (for -v)
        self.log: list[str] = []
        self.stub: int | None = None  # the region's return stub, once the caller wrote one
        self.saved: Regs = Regs()
        self.sigmask = 0
        self._attached = False
        self._mem_fd = -1
        self._xstate = b""
        self._xstate_note = NT_X86_XSTATE
        self._first_sig = 0  # the signal our first stop interrupted the delivery of, still due
        self._stop = ""  # the current stop: "event", "signal" or "syscall"
        self._borrowed = False  # registers or mask changed: detaching must restore them
        self._frame = 0  # where the signal frame is (the rsp of every call), 0: not written
        self._pretcode = 0  # the return address now in the frame
        self._gadget = 0  # libc's rt_sigreturn sequence and where rip is after its syscall
        self._gadget_end = 0

    # -- attach / detach ------------------------------------------------------------------------

    def __enter__(self) -> Tracee:
        self.attach()
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def attach(self) -> None:
        if stuck_in_disk_sleep(self.pid, self.tid):
            # An interrupt would only take effect when the I/O ends; the thread stays ours
            # until then. Refuse instead of waiting an unknown time.
            raise PtraceError("the main thread is in uninterruptible sleep (disk or network "
                              "file system I/O)", errno.EBUSY)
        # TRACESYSGOOD: a tracer that vanishes during a syscall stop leaves an exit code the
        # kernel cannot send (0x85); a bare SIGTRAP would be sent to the thread and kill it.
        _ptrace(PTRACE_SEIZE, self.tid, 0, PTRACE_O_TRACESYSGOOD, f"PTRACE_SEIZE of {self.tid}")
        self._attached = True
        try:
            _ptrace(PTRACE_INTERRUPT, self.tid, 0, 0, "PTRACE_INTERRUPT")
            self._wait_first_stop()
            self.check()
            self._save_state()
            self._mem_fd = os.open(f"/proc/{self.pid}/mem", os.O_RDWR | os.O_CLOEXEC)
            if self._first_sig in _CRASH_SIGNALS:
                raise PtraceError(f"the main thread was being sent signal {self._first_sig} "
                                  "(a fault?) when it stopped", errno.EAGAIN)
        except BaseException:
            self.detach()
            raise

    def _wait_first_stop(self) -> None:
        # A running thread cannot be detached and the interrupt stays pending: giving up early
        # would leave the thread to stop later with nobody to resume it (until this process
        # exits, when the kernel lets go). So wait long, and say so.
        deadline = time.monotonic() + self.stop_timeout
        extended = False
        while True:
            status = self._wait(deadline, "to stop")
            if status is None:
                if extended:
                    raise PtraceError("the main thread did not stop within "
                                      f"{self.stop_timeout + 60:.0f}s", errno.ETIMEDOUT)
                self.log.append("thread did not stop in time; still waiting")
                deadline = time.monotonic() + 60.0
                extended = True
                continue
            if (status >> 16) == PTRACE_EVENT_STOP:
                self._stop = "event"
                return
            # A signal-delivery stop came first: a stop we can use; the signal is still due.
            self._stop = "signal"
            self._first_sig = os.WSTOPSIG(status)
            self.held_signals.append(self._first_sig)
            return

    def detach(self) -> None:
        if not self._attached:
            return
        try:
            if self._borrowed:
                self._finish()
        finally:
            if self._mem_fd >= 0:
                os.close(self._mem_fd)
                self._mem_fd = -1
            try:
                _ptrace(PTRACE_DETACH, self.tid, 0, self._first_sig, "PTRACE_DETACH")
            except PtraceError as exc:
                if exc.errno != errno.ESRCH:
                    raise
            self._attached = False

    # -- state ----------------------------------------------------------------------------------

    def _save_state(self) -> None:
        _ptrace(PTRACE_GETREGS, self.tid, 0, self.saved, "PTRACE_GETREGS")
        buf = ctypes.create_string_buffer(_XSTATE_BUFFER)
        iov = _IoVec(ctypes.cast(buf, ctypes.c_void_p), _XSTATE_BUFFER)
        try:
            _ptrace(PTRACE_GETREGSET, self.tid, NT_X86_XSTATE, iov, "PTRACE_GETREGSET xstate")
        except PtraceError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENODEV):
                raise
            # No XSAVE on this CPU: the legacy FXSAVE area is the whole vector state.
            self._xstate_note = NT_PRFPREG
            iov = _IoVec(ctypes.cast(buf, ctypes.c_void_p), _XSTATE_BUFFER)
            _ptrace(PTRACE_GETREGSET, self.tid, NT_PRFPREG, iov, "PTRACE_GETREGSET fpregs")
        if iov.len >= _XSTATE_BUFFER:
            raise PtraceError("XSAVE area larger than expected", errno.EOVERFLOW)
        self._xstate = buf.raw[:int(iov.len)]
        mask = ctypes.c_uint64()
        _ptrace(PTRACE_GETSIGMASK, self.tid, 8, mask, "PTRACE_GETSIGMASK")
        self.sigmask = int(mask.value)
        self.log.append(f"saved registers, signal mask and {len(self._xstate)} bytes of "
                        f"{'XSAVE' if self._xstate_note == NT_X86_XSTATE else 'FXSAVE'} state")

    def _set_mask(self, mask: int) -> None:
        value = ctypes.c_uint64(mask)
        _ptrace(PTRACE_SETSIGMASK, self.tid, 8, value, "PTRACE_SETSIGMASK")

    def _restore_exact(self) -> None:
        """Put the saved state back; only at a stop inside the kernel's signal path (an interrupt
        or signal-delivery stop), where it then restarts an interrupted system call itself.
        Registers last: until then they lead into rt_sigreturn, which restores the rest too."""
        xstate = ctypes.create_string_buffer(self._xstate, len(self._xstate))
        iov = _IoVec(ctypes.cast(xstate, ctypes.c_void_p), len(self._xstate))
        _ptrace(PTRACE_SETREGSET, self.tid, self._xstate_note, iov, "PTRACE_SETREGSET")
        self._set_mask(self.sigmask)
        _ptrace(PTRACE_SETREGS, self.tid, 0, self.saved, "PTRACE_SETREGS")
        self._borrowed = False

    def _rearm(self) -> None:
        """Point the stopped thread at libc's rt_sigreturn with our frame, skipping any system
        call it is about to make: if we vanish now, it restores itself."""
        regs = Regs()
        _ptrace(PTRACE_GETREGS, self.tid, 0, regs, "PTRACE_GETREGS")
        regs.rip = self._gadget
        regs.rsp = self._frame + 8
        regs.orig_rax = _U64
        regs.eflags &= ~(1 << 8)
        _ptrace(PTRACE_SETREGS, self.tid, 0, regs, "PTRACE_SETREGS")

    def _finish(self, passed: int = 0) -> None:
        """From any stop during or between our calls, back to the exact saved state
        (``passed``: a stop signal that stopped us, handed on when we resume)."""
        if self._stop == "event" or (self._stop == "signal" and self._first_sig):
            self._restore_exact()
            return
        # Elsewhere (a syscall stop, a fault) the kernel would not restart the interrupted
        # system call after our restore: go through an interrupt stop, armed meanwhile.
        self._rearm()
        _ptrace(PTRACE_INTERRUPT, self.tid, 0, 0, "PTRACE_INTERRUPT")
        _ptrace(PTRACE_CONT, self.tid, 0, passed, "PTRACE_CONT")
        while True:
            status = self._wait(time.monotonic() + 30.0, "to stop")
            if status is None:
                continue
            if (status >> 16) == PTRACE_EVENT_STOP:  # our interrupt, or a group stop
                break
            # only an unblockable signal (SIGSTOP) can come first: let it take its course
            sig = os.WSTOPSIG(status)
            passed = 0 if sig in _CRASH_SIGNALS or sig == SYSCALL_STOP else sig
            _ptrace(PTRACE_CONT, self.tid, 0, passed, "PTRACE_CONT")
        self._stop = "event"
        self._restore_exact()

    @property
    def syscall(self) -> int:  # the system call the thread was stopped in, -1: user code
        return self.saved.signed("orig_rax")

    # -- memory ---------------------------------------------------------------------------------

    def read(self, addr: int, size: int) -> bytes:
        data = os.pread(self._mem_fd, size, addr)
        if len(data) != size:
            raise PtraceError(f"short read at {addr:#x}", errno.EIO)
        return data

    def write(self, addr: int, data: bytes) -> None:
        """Write through /proc/PID/mem: it may write pages the target mapped read-only."""
        self.check()
        _step(f"write {len(data)} bytes at {addr:#x}")
        done = 0
        while done < len(data):
            n = os.pwrite(self._mem_fd, data[done:], addr + done)
            if n <= 0:
                raise PtraceError(f"write at {addr + done:#x}", errno.EIO)
            done += n

    # -- the frame every call returns through ---------------------------------------------------

    def _place_frame(self) -> None:
        from flight_profiler.attach.elf_symbols import parse_maps

        with open(f"/proc/{self.pid}/maps") as f:
            maps = parse_maps(f.read())
        try:
            self._gadget, self._gadget_end = sigframe.find_in(maps, self.read)
        except LookupError as exc:
            raise PtraceError(str(exc), errno.ENOEXEC) from None
        fpstate = sigframe.fpstate_image(self._xstate, self._xstate_note == NT_X86_XSTATE)
        frame, fp_addr = sigframe.layout(self.saved.rsp, _RED_ZONE_GAP, len(fpstate))
        room = sigframe.stack_room(maps, self.saved.rsp, frame)
        if room:
            raise PtraceError(f"the main thread's stack has {room}", errno.ENOSPC)
        data = sigframe.build(sigframe.restarted(self.saved), self.sigmask, frame, fp_addr,
                              fpstate, self._gadget)
        self.write(frame, data)
        self._frame = frame
        self._pretcode = self._gadget
        self.log.append(f"signal frame of {len(data)} bytes at {frame:#x}; rt_sigreturn "
                        f"sequence at {self._gadget:#x}")

    # -- calls ----------------------------------------------------------------------------------

    def call(self, fn: int, *args: int, timeout: float = 5.0, syscall: int | None = None) -> int:
        """Call ``fn(*args)`` (up to six integer/pointer arguments) in the borrowed thread.

        It returns into ``self.stub`` when set (the result is kept in rdi), else straight into
        libc's rt_sigreturn, which loses ``rax``: such a call must be a thin wrapper of system
        call ``syscall``, whose return value (from its exit stop) is then the result.
        """
        if not 0 < fn < 1 << 47:
            raise ValueError(f"bad function address {fn:#x}")
        if len(args) > 6:
            raise ValueError("at most six arguments")
        if self.stub is None and syscall is None:
            raise ValueError("a call before the stub exists needs the system call it wraps")
        if not self._frame:
            self._place_frame()
        ret = self.stub if self.stub is not None else self._gadget
        if self._pretcode != ret:
            self.write(self._frame, ret.to_bytes(8, "little"))
            self._pretcode = ret
        end = ret + sigframe.STUB_END if self.stub is not None else self._gadget_end
        regs = self.saved.copy()
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, name, value & _U64)
        regs.rsp = self._frame
        regs.rip = fn
        regs.rax = 0  # no vector registers used by a varargs call
        regs.orig_rax = _U64  # -1: do not restart (or make) a system call into our function
        regs.eflags &= ~(1 << 10 | 1 << 8)  # the ABI wants DF clear; never single-step
        _ptrace(PTRACE_SETREGS, self.tid, 0, regs, "PTRACE_SETREGS")
        if not self._borrowed:
            self._borrowed = True
            self._set_mask(self.sigmask | _BLOCKED_DURING_CALLS)
        # Resuming a signal-delivery stop with its signal, now blocked, requeues it as it was.
        sig, self._first_sig = self._first_sig, 0
        _ptrace(PTRACE_SYSCALL, self.tid, 0, sig, "PTRACE_SYSCALL")
        deadline = time.monotonic() + timeout
        result: int | None = None
        while True:
            status = self._wait(deadline, "for a call to return")
            if status is None:
                self._abandon()
                raise CallTimeout(f"call of {fn:#x} did not return in {timeout:.1f}s")
            sig = os.WSTOPSIG(status)
            if (status >> 16) == PTRACE_EVENT_STOP:
                self._stop = "event"
                _ptrace(PTRACE_SYSCALL, self.tid, 0, 0, "PTRACE_SYSCALL")
                continue
            if sig != SYSCALL_STOP:
                self._stop = "signal"
                if sig in _CRASH_SIGNALS:
                    rip = Regs()
                    _ptrace(PTRACE_GETREGS, self.tid, 0, rip, "PTRACE_GETREGS")
                    self._finish()
                    raise CallCrashed(f"call of {fn:#x} faulted with signal {sig} at "
                                      f"{rip.rip:#x}")
                _ptrace(PTRACE_SYSCALL, self.tid, 0, sig, "PTRACE_SYSCALL")  # SIGSTOP: honour
                continue
            self._stop = "syscall"
            out = Regs()
            _ptrace(PTRACE_GETREGS, self.tid, 0, out, "PTRACE_GETREGS")
            entry = out.signed("rax") == -sigframe.ENOSYS
            if entry and out.orig_rax == sigframe.SYS_RT_SIGRETURN and out.rip == end \
                    and out.rsp == self._frame + 8:
                if self.stub is not None:
                    return int(out.rdi)
                if result is None:
                    raise PtraceError(f"call of {fn:#x} made no system call {syscall}",
                                      errno.ENOSYS)
                return result
            if not entry and out.orig_rax == syscall:
                result = int(out.rax)
            _ptrace(PTRACE_SYSCALL, self.tid, 0, 0, "PTRACE_SYSCALL")

    def _abandon(self) -> None:
        """Stop the thread where it is and put its saved state back."""
        _ptrace(PTRACE_INTERRUPT, self.tid, 0, 0, "PTRACE_INTERRUPT")
        passed = 0
        while True:
            status = self._wait(time.monotonic() + 30.0, "to stop")
            if status is None:
                continue
            if (status >> 16) == PTRACE_EVENT_STOP:
                self._stop = "event"
            elif os.WSTOPSIG(status) == SYSCALL_STOP:
                self._stop = "syscall"
            else:  # a fault (discarded), or SIGSTOP (handed on)
                self._stop = "signal"
                if os.WSTOPSIG(status) not in _CRASH_SIGNALS:
                    passed = os.WSTOPSIG(status)
            break
        self._finish(passed)

    def _wait(self, deadline: float, what: str) -> int | None:
        """The next stop status, or None when ``deadline`` passed with none."""
        delay = 0.0002
        # A stop sends us SIGCHLD: with it blocked and nobody's (signals_held), wait for it.
        sigchld = (signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
                   and signal.SIGCHLD in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        while True:
            try:
                wpid, status = os.waitpid(self.tid, os.WNOHANG | WALL)
            except ChildProcessError:
                raise TargetExited(f"process {self.pid} is gone") from None
            if wpid:
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    self._attached = False
                    raise TargetExited(f"process {self.pid} exited while waiting {what}")
                if os.WIFSTOPPED(status):
                    return status
            left = deadline - time.monotonic()
            if left < 0:
                return None
            if sigchld:
                signal.sigtimedwait([signal.SIGCHLD], min(left, 0.005))
            else:
                time.sleep(delay)
                delay = min(delay * 2, 0.005)


def signed(value: int) -> int:
    """A 64-bit register value as a signed integer."""
    value &= _U64
    return value - (1 << 64) if value >> 63 else value
