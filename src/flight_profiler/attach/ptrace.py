"""Borrow one thread of a live process over ptrace and call functions in it (x86-64 Linux).

ctypes over libc only: no compiler, no gdb. The recipe was measured on this project's machines
(../shared/design/injection.md); each step has its reason:

- PTRACE_SEIZE + PTRACE_INTERRUPT, not PTRACE_ATTACH: no SIGSTOP is queued that could later
  stop the whole process, and the other threads keep running (they may hold locks our calls need).
- The COMPLETE register state is saved before anything is changed and written back before
  detaching: the general registers (``orig_rax`` and ``rax`` carry the kernel's syscall-restart
  state) and the whole XSAVE area, whatever its size (11008 bytes with AVX-512 and AMX here):
  gdb 13 cannot write that area back, which is what killed targets.
- A call runs 256 bytes below the interrupted stack pointer (past the 128-byte red zone), on a
  16-byte aligned stack, with return address 0: the function returns into a fault at rip 0, the
  thread stops with SIGSEGV, and ``rax`` holds the result. ``orig_rax = -1`` so the kernel does not
  restart the interrupted system call into our function; restoring the saved ``orig_rax``/``rax``
  afterwards lets it restart the system call exactly as it would have.
- Signals that arrive for the thread while it runs our call are held back and delivered after
  the registers are restored (PTRACE_DETACH with the signal, ``tgkill`` for any further ones).
- SIGINT/SIGTERM to the CLI are blocked while the thread is borrowed: it is never left stopped
  or half-modified by a Ctrl-C.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager

PTRACE_CONT = 7
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
NT_PRFPREG = 2
NT_X86_XSTATE = 0x202
WALL = 0x40000000

# Far larger than any XSAVE layout the kernel reports today (11008 bytes with AMX).
_XSTATE_BUFFER = 1 << 16
_RED_ZONE_GAP = 256
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                            signal.SIGABRT, signal.SIGTRAP})
_U64 = (1 << 64) - 1

# Tests only (the aimed kill loop, bench/bench_injector_kills.py): "K" makes the injector stop
# itself (SIGSTOP) just before its K-th ptrace request or memory write, after saying so on
# stderr, so that a kill lands exactly between two steps; "list" names every step on stderr.
_PAUSE_AT = os.environ.get("FLIGHT_PROFILER_TEST_PAUSE_AT", "")
_steps = [0]


def _step(what: str) -> None:
    if not _PAUSE_AT:
        return
    _steps[0] += 1
    if _PAUSE_AT == "list":
        os.write(2, f"fp-step {_steps[0]} {what}\n".encode())
    elif str(_steps[0]) == _PAUSE_AT:
        os.write(2, f"fp-paused {_steps[0]} {what}\n".encode())
        os.kill(os.getpid(), signal.SIGSTOP)


def supported() -> bool:
    """Whether this machine can use the own injector (the kernel ABI here is x86-64's)."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "amd64")


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


class Regs(ctypes.Structure):
    """``struct user_regs_struct`` of x86-64 (sys/user.h), in the kernel's order."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
        "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
        "gs_base", "ds", "es", "fs", "gs")]

    def copy(self) -> Regs:
        clone = Regs()
        ctypes.memmove(ctypes.byref(clone), ctypes.byref(self), ctypes.sizeof(Regs))
        return clone

    def signed(self, name: str) -> int:
        value = int(getattr(self, name))
        return value - (1 << 64) if value >> 63 else value


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


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread, as the kernel would have had we not held it back."""
    _lib().syscall(234, pid, tid, sig)  # SYS_tgkill on x86-64


def _signed64(value: int) -> int:
    value &= _U64
    return value - (1 << 64) if value >> 63 else value


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP/SIGQUIT for the caller while a thread of the target is borrowed.

    They are delivered when the block ends, after the target was restored and detached.
    """
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Tracee:
    """One stopped thread of a process, with its complete saved state.

    Use as a context manager: ``__exit__`` restores the saved state and detaches on every path.
    """

    def __init__(self, pid: int, tid: int | None = None, stop_timeout: float = 5.0) -> None:
        self.pid = pid
        self.tid = tid if tid is not None else pid
        self.stop_timeout = stop_timeout
        self.held_signals: list[int] = []  # arrived while borrowed; delivered on detach
        self.log: list[str] = []
        self._attached = False
        self._mem_fd = -1
        self.saved: Regs = Regs()
        self._xstate: ctypes.Array[ctypes.c_char] | None = None
        self._xstate_len = 0
        self._xstate_note = NT_X86_XSTATE
        self._dirty = False  # registers or XSAVE area differ from the saved ones

    # -- attach / detach ------------------------------------------------------------------------

    def __enter__(self) -> Tracee:
        self.attach()
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def attach(self) -> None:
        if thread_state(self.pid, self.tid) == "D":
            # An interrupt would only take effect when the I/O ends; the thread stays ours
            # until then. Refuse instead of waiting an unknown time.
            raise PtraceError("the main thread is in uninterruptible sleep (disk or network "
                              "file system I/O)", errno.EBUSY)
        _ptrace(PTRACE_SEIZE, self.tid, 0, 0, f"PTRACE_SEIZE of {self.tid}")
        self._attached = True
        try:
            _ptrace(PTRACE_INTERRUPT, self.tid, 0, 0, "PTRACE_INTERRUPT")
            self._wait_first_stop()
            self._save_state()
            self._mem_fd = os.open(f"/proc/{self.pid}/mem", os.O_RDWR | os.O_CLOEXEC)
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
                return
            sig = os.WSTOPSIG(status)
            # A signal-delivery stop came first: it is a stop we can use; the signal is held.
            self.held_signals.append(sig)
            return

    def detach(self) -> None:
        if not self._attached:
            return
        try:
            if self._dirty:
                self._restore_state()
        finally:
            if self._mem_fd >= 0:
                os.close(self._mem_fd)
                self._mem_fd = -1
            first = self.held_signals[0] if self.held_signals else 0
            try:
                _ptrace(PTRACE_DETACH, self.tid, 0, first, "PTRACE_DETACH")
            except PtraceError as exc:
                if exc.errno != errno.ESRCH:
                    raise
            self._attached = False
            for sig in self.held_signals[1:]:
                _tgkill(self.pid, self.tid, sig)

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
        self._xstate = buf
        self._xstate_len = int(iov.len)
        self.log.append(f"saved registers and {self._xstate_len} bytes of "
                        f"{'XSAVE' if self._xstate_note == NT_X86_XSTATE else 'FXSAVE'} state")

    def _restore_state(self) -> None:
        assert self._xstate is not None
        iov = _IoVec(ctypes.cast(self._xstate, ctypes.c_void_p), self._xstate_len)
        _ptrace(PTRACE_SETREGSET, self.tid, self._xstate_note, iov, "PTRACE_SETREGSET")
        _ptrace(PTRACE_SETREGS, self.tid, 0, self.saved, "PTRACE_SETREGS")
        self._dirty = False

    @property
    def syscall(self) -> int:
        """The system call the thread was stopped in (>= 0), or -1 when it ran user code."""
        return self.saved.signed("orig_rax")

    # -- memory ---------------------------------------------------------------------------------

    def read(self, addr: int, size: int) -> bytes:
        data = os.pread(self._mem_fd, size, addr)
        if len(data) != size:
            raise PtraceError(f"short read at {addr:#x}", errno.EIO)
        return data

    def write(self, addr: int, data: bytes) -> None:
        """Write through /proc/PID/mem: it may write pages the target mapped read-only."""
        _step(f"write {len(data)} bytes at {addr:#x}")
        done = 0
        while done < len(data):
            n = os.pwrite(self._mem_fd, data[done:], addr + done)
            if n <= 0:
                raise PtraceError(f"write at {addr + done:#x}", errno.EIO)
            done += n

    # -- calls ----------------------------------------------------------------------------------

    def call(self, fn: int, *args: int, timeout: float = 5.0) -> int:
        """Call ``fn(*args)`` (up to six integer/pointer arguments) in the borrowed thread."""
        if not 0 < fn < 1 << 47:
            raise ValueError(f"bad function address {fn:#x}")
        if len(args) > 6:
            raise ValueError("at most six arguments")
        regs = self.saved.copy()
        sp = ((self.saved.rsp - _RED_ZONE_GAP) & ~0xF) - 8
        self.write(sp, struct.pack("<Q", 0))  # return address: 0, so returning faults
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, name, value & _U64)
        regs.rsp = sp
        regs.rip = fn
        regs.rax = 0  # no vector registers used by a varargs call
        regs.orig_rax = _U64  # -1: do not restart the interrupted system call into our function
        regs.eflags &= ~(1 << 10 | 1 << 8)  # the ABI wants DF clear; never single-step
        self._dirty = True
        _ptrace(PTRACE_SETREGS, self.tid, 0, regs, "PTRACE_SETREGS")
        _ptrace(PTRACE_CONT, self.tid, 0, 0, "PTRACE_CONT")
        deadline = time.monotonic() + timeout
        while True:
            status = self._wait(deadline, "for a call to return")
            if status is None:
                self._abandon_call()
                raise CallTimeout(f"call of {fn:#x} did not return in {timeout:.1f}s")
            if (status >> 16) == PTRACE_EVENT_STOP:
                _ptrace(PTRACE_CONT, self.tid, 0, 0, "PTRACE_CONT")
                continue
            sig = os.WSTOPSIG(status)
            out = Regs()
            _ptrace(PTRACE_GETREGS, self.tid, 0, out, "PTRACE_GETREGS")
            if sig == signal.SIGSEGV and out.rip == 0:
                self._restore_state()
                return int(out.rax)
            if sig in _CRASH_SIGNALS:
                self._restore_state()
                raise CallCrashed(f"call of {fn:#x} faulted with signal {sig} at {out.rip:#x}")
            self.held_signals.append(sig)
            _ptrace(PTRACE_CONT, self.tid, 0, 0, "PTRACE_CONT")

    def _abandon_call(self) -> None:
        """Stop the thread where it is and put its saved state back."""
        _ptrace(PTRACE_INTERRUPT, self.tid, 0, 0, "PTRACE_INTERRUPT")
        while True:
            status = self._wait(time.monotonic() + 30.0, "to stop")
            if status is None:
                continue
            if (status >> 16) != PTRACE_EVENT_STOP:
                sig = os.WSTOPSIG(status)
                if sig not in _CRASH_SIGNALS:
                    self.held_signals.append(sig)
            break
        self._restore_state()

    def _wait(self, deadline: float, what: str) -> int | None:
        """The next stop status, or None when ``deadline`` passed with none."""
        delay = 0.0002
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
            if time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.005)


def signed(value: int) -> int:
    """A 64-bit register value as a signed integer."""
    return _signed64(value)
