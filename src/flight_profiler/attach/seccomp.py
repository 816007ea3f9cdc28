"""Will the target's seccomp sandbox kill it for what an injection does? Decide before any call.

An injection makes the borrowed thread call ``mmap(PROT_EXEC)``, start a thread (``clone``),
return through ``rt_sigreturn``; the agent then opens a Unix socket and files. A seccomp filter
that answers one of these with KILL or TRAP (SIGSYS) would end the job. So (``/proc/PID/status``
``Seccomp:`` and ``Seccomp_filters:``):

- no seccomp: go on;
- strict mode (1): only read/write/exit are allowed: refused, nothing is touched;
- filter mode (2): the filters are read with PTRACE_SECCOMP_GET_FILTER (needs CAP_SYS_ADMIN and
  a CLI not itself under seccomp: root on the host) and RUN here, on each of those system calls
  with the arguments they are made with; one KILL, TRAP or USER_NOTIF answer refuses the attach,
  naming the call. An ERRNO answer is no danger (that call fails, and the attach says so).
- filters that cannot be read: known to be allowed only when this CLI runs under as many filters
  in the same pid and mount namespaces (the same container, which gave both the same filter):
  a forked child of this CLI then makes those calls for real, and must survive. Otherwise refused,
  saying how to run so that the filter can be checked.
Targets on a user shadow stack (x86 CET) are refused as well: the calls' return addresses would
fault on it. The filters can test the instruction pointer; ours is left 0 (filters do not).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct

from flight_profiler.errors import AttachFailed
from flight_profiler.records import FrozenRecord

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Callable

AUDIT_ARCH_X86_64 = 0xC000003E
RET_KILL_PROCESS = 0x80000000
RET_KILL_THREAD = 0
RET_TRAP = 0x00030000
RET_ERRNO = 0x00050000
RET_USER_NOTIF = 0x7FC00000
RET_TRACE = 0x7FF00000
RET_LOG = 0x7FFC0000
RET_ALLOW = 0x7FFF0000
_ACTION = 0xFFFF0000
_DEADLY = {RET_KILL_PROCESS: "kill the process", RET_KILL_THREAD: "kill the thread",
           RET_TRAP: "send it SIGSYS", RET_USER_NOTIF: "hand it to a supervisor"}
_NEG1 = (1 << 64) - 1
_THREAD_FLAGS = 0x3D0F00  # CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID

# What the injection and the agent make, as (what, number, arguments that filters test).
CALLS: tuple[tuple[str, int, tuple[int, ...]], ...] = (
    ("mmap(PROT_READ|PROT_EXEC)", 9, (0, 20480, 5, 0x22, _NEG1, 0)),
    ("munmap", 11, (0, 4096)),
    ("rt_sigreturn", 15, ()),
    ("rt_sigprocmask", 14, (2, 0, 0, 8)),
    ("mmap (a thread's stack)", 9, (0, 8 << 20, 0, 0x20022, _NEG1, 0)),
    ("mmap (memory)", 9, (0, 1 << 20, 3, 0x22, _NEG1, 0)),
    ("mprotect", 10, (0, 8 << 20, 3)),
    ("clone (a thread)", 56, (_THREAD_FLAGS, 0, 0, 0, 0)),
    ("set_robust_list", 273, (0, 24)),
    ("rseq", 334, (0, 32, 0, 0)),
    ("futex", 202, (0, 0x80, 0, 0)),
    ("futex wake", 202, (0, 0x81, 1)),
    ("madvise", 28, (0, 8 << 20, 4)),
    ("exit (of a thread)", 60, (0,)),
    ("getpid", 39, ()),
    ("gettid", 186, ()),
    ("socket(AF_UNIX)", 41, (1, 0x80001, 0)),
    ("bind", 49, (3, 0, 110)),
    ("listen", 50, (3, 128)),
    ("accept4", 288, (3, 0, 0, 0x80000)),
    ("getsockopt(SO_PEERCRED)", 55, (4, 1, 17, 0, 0)),
    ("sendto", 44, (4, 0, 1, 0x4000, 0, 0)),
    ("recvfrom", 45, (4, 0, 1, 0, 0, 0)),
    ("shutdown", 48, (4, 2)),
    ("openat", 257, (_NEG1 - 99, 0, 0x80241, 0o600)),
    ("read", 0, (5, 0, 1)),
    ("write", 1, (5, 0, 1)),
    ("close", 3, (5,)),
    ("newfstatat", 262, (5, 0, 0, 0x1000)),
    ("lseek", 8, (5, 0, 1)),
    ("fcntl", 72, (5, 1)),
    ("ioctl(TCGETS)", 16, (5, 0x5401, 0)),
    ("getdents64", 217, (5, 0, 4096)),
    ("mkdir", 83, (0, 0o700)),
    ("rename", 82, (0, 0)),
    ("unlink", 87, (0,)),
    ("poll", 7, (0, 1, 100)),
    ("clock_nanosleep", 230, (1, 0, 0, 0)),
)



class Status(FrozenRecord):
    """The seccomp lines of /proc/PID/status (frozen; records.py says why it is not a dataclass)."""

    FIELDS = ("mode", "filters", "shadow_stack")
    mode: int  # 0 none, 1 strict, 2 filter, -1 unknown (no such line: kernel without seccomp)
    filters: int  # -1: unknown (kernels before 5.9 do not say)
    shadow_stack: bool

    def __init__(self, mode: int, filters: int, shadow_stack: bool) -> None:
        self._set("mode", mode)
        self._set("filters", filters)
        self._set("shadow_stack", shadow_stack)


def parse_status(text: str) -> Status:
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}

    def number(key: str) -> int:
        try:
            return int(fields.get(key, "-1"))
        except ValueError:
            return -1

    return Status(number("Seccomp"), number("Seccomp_filters"),
                  "shstk" in fields.get("x86_Thread_features", "").split())


def run_filter(prog: bytes, nr: int, args: tuple[int, ...], arch: int = AUDIT_ARCH_X86_64,
               ip: int = 0) -> int:
    """The return value of one classic-BPF seccomp program for one system call."""
    data = struct.pack("<iIQ6Q", nr, arch, ip, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog) - 7, 8)]
    a = x = 0
    mem = [0] * 16
    pc = 0
    while 0 <= pc < len(insns):
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if cls == 0x00 or cls == 0x01:  # LD / LDX
            mode = code & 0xE0
            if mode == 0x20:  # ABS (LD only in seccomp): a 32-bit word of seccomp_data
                val = struct.unpack_from("<I", data, k)[0] if k + 4 <= len(data) else 0
            elif mode == 0x80:  # LEN
                val = len(data)
            elif mode == 0x00:  # IMM
                val = k
            elif mode == 0x60:  # MEM
                val = mem[k & 15]
            else:
                raise ValueError(f"unsupported load {code:#x}")
            if cls == 0x00:
                a = val
            else:
                x = val
        elif cls == 0x02:
            mem[k & 15] = a
        elif cls == 0x03:
            mem[k & 15] = x
        elif cls == 0x04:  # ALU
            op, src = code & 0xF0, x if code & 0x08 else k
            if op == 0x80:
                a = -a
            elif op in (0x30, 0x90) and src == 0:
                return RET_KILL_THREAD  # the kernel refuses such a filter; never reached
            else:
                a = {0x00: a + src, 0x10: a - src, 0x20: a * src, 0x30: a // max(src, 1),
                     0x40: a | src, 0x50: a & src, 0x60: a << (src & 31), 0x70: a >> (src & 31),
                     0x90: a % max(src, 1), 0xA0: a ^ src}[op]
            a &= 0xFFFFFFFF
        elif cls == 0x05:  # JMP
            op = code & 0xF0
            if op == 0x00:
                pc += k
                continue
            src = x if code & 0x08 else k
            cond = {0x10: a == src, 0x20: a > src, 0x30: a >= src, 0x40: bool(a & src)}[op]
            pc += jt if cond else jf
        elif cls == 0x06:  # RET
            return (a if code & 0x18 == 0x10 else k) & 0xFFFFFFFF
        elif cls == 0x07:  # MISC: TAX / TXA
            if code & 0xF8 == 0x00:
                x = a
            else:
                a = x
    return RET_KILL_THREAD  # ran off the end: the kernel's verifier forbids it


def verdict(programs: list[bytes], nr: int, args: tuple[int, ...]) -> int:
    """What all the filters together answer: the most restrictive action wins."""
    def rank(ret: int) -> int:
        action = ret & _ACTION
        return action - (1 << 32) if action >> 31 else action

    answers = [run_filter(p, nr, args) for p in programs]
    return min(answers, key=rank) if answers else RET_ALLOW


def deadly_call(programs: list[bytes]) -> tuple[str, str] | None:
    """(the call, what the filter would do) for the first of CALLS the filters would not let
    through alive, or None."""
    for what, nr, args in CALLS:
        action = verdict(programs, nr, args) & _ACTION
        if action in _DEADLY:
            return what, _DEADLY[action]
    return None


def refusal(pid: int, why: str, hint: str) -> AttachFailed:
    return AttachFailed(f"process {pid} runs in a seccomp sandbox: {why}; nothing was injected",
                        hint)


_HOST_HINT = ("run flight_profiler as root outside any seccomp sandbox (e.g. `sudo` on the "
              "host), where it can read the filter and check it allows the injection")


def check_status(pid: int, status: Status) -> None:
    """What /proc alone decides (before any ptrace): strict mode and shadow stacks refused."""
    if status.mode == 1:
        raise refusal(pid, "strict mode (only read, write and exit are allowed: any other call, "
                      "such as the injection's, would kill it)",
                      "flight_profiler cannot attach to a strict-mode seccomp process")
    if status.shadow_stack:
        raise AttachFailed(f"process {pid} runs with a user shadow stack (x86 CET), on which "
                           "the injection's calls would fault; nothing was injected",
                           "start the job without shadow stacks (unset GLIBC_TUNABLES "
                           "glibc.cpu.x86_shstk) to be able to attach")


def check_filters(pid: int, status: Status, read: Callable[[], list[bytes]],
                  probe: Callable[[], str | None] | None = None) -> str:
    """Raise AttachFailed unless the filters are known to let the injection through; return
    how that is known (for -v). ``read`` returns the filters (raises OSError if it cannot)."""
    if status.mode != 2:
        return "no seccomp filter"
    try:
        programs = read()
    except OSError as exc:
        if probe is None:
            raise refusal(pid, f"its {status.filters} seccomp filter(s) cannot be read here "
                          f"({exc.strerror}), so whether they would kill it for the injection's "
                          "calls is unknown", _HOST_HINT) from None
        dead = probe()
        if dead:
            raise refusal(pid, f"its seccomp filter, the same as this CLI's, kills a process "
                          f"for {dead}", "attach from outside the sandbox") from None
        return "filters unreadable; the same filters in this CLI let a test child through"
    found = deadly_call(programs)
    if found:
        raise refusal(pid, f"its seccomp filter would {found[1]} for {found[0]}, which the "
                      "injection or the agent needs",
                      "flight_profiler cannot attach to a job sandboxed this way; relax the "
                      "filter to allow those calls, or profile it from inside its own code")
    return f"{len(programs)} seccomp filter(s) read: they allow every call the injection makes"


# -- reading the filters of a stopped tracee -------------------------------------------------

PTRACE_SECCOMP_GET_FILTER = 0x420C


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    lib.ptrace.restype = ctypes.c_long
    return lib


def read_filters_briefly(pid: int, count: int, timeout: float = 60.0) -> list[bytes]:
    """The filters of ``pid``'s main thread, held in a ptrace stop just for the reading (any
    architecture; raises OSError when it cannot). Nothing of the thread is changed."""
    import time

    lib = _lib()
    if lib.ptrace(0x4206, pid, None, None) != 0:  # PTRACE_SEIZE
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    try:
        lib.ptrace(0x4207, pid, None, None)  # PTRACE_INTERRUPT
        deadline = time.monotonic() + timeout
        while not os.waitpid(pid, os.WNOHANG | 0x40000000)[0]:
            if time.monotonic() > deadline:
                raise OSError(62, "the thread did not stop")  # ETIME
            time.sleep(0.001)
        return read_filters(pid, count)
    finally:
        lib.ptrace(17, pid, None, None)  # PTRACE_DETACH (a pending interrupt is dropped)


def read_filters(tid: int, count: int) -> list[bytes]:
    """The cBPF programs of a thread we trace and hold stopped (index 0: the newest)."""
    lib = _lib()
    programs = []
    for index in range(count if count >= 0 else 1 << 10):
        n = lib.ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, None)
        if n < 0:
            err = ctypes.get_errno()
            if err == 2 and count < 0:  # ENOENT: no more filters
                break
            raise OSError(err, os.strerror(err))
        buf = ctypes.create_string_buffer(n * 8)
        if lib.ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, buf) != n:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        programs.append(buf.raw)
    return programs


# -- filters this CLI shares with the target -------------------------------------------------

def same_sandbox(pid: int, status: Status) -> bool:
    """This CLI runs under as many filters as the target, in its pid and mount namespaces:
    the same container, whose runtime gave both the same filter."""
    try:
        with open("/proc/self/status") as f:
            own = parse_status(f.read())
        if own.mode != 2 or status.filters < 1 or own.filters != status.filters:
            return False
        return all(os.readlink(f"/proc/self/ns/{ns}") == os.readlink(f"/proc/{pid}/ns/{ns}")
                   for ns in ("pid", "mnt"))
    except OSError:
        return False


def probe_in_child() -> str | None:
    """Make the injection's and the agent's kinds of calls in a forked child of this process;
    the one it died of (named with the signal), or None when it came through."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(r)
            _probe_calls(lambda what: os.write(w, (what + "\n").encode()))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    said = b""
    with os.fdopen(r, "rb") as f:
        said = f.read()
    _, wstatus = os.waitpid(child, 0)
    if os.WIFSIGNALED(wstatus):
        steps = said.decode(errors="replace").split()
        return f"{steps[-1] if steps else 'its first call'} (signal {os.WTERMSIG(wstatus)})"
    return None


def _probe_calls(say: Callable[[str], object]) -> None:  # pragma: no cover - in the child
    import mmap
    import shutil
    import signal
    import socket
    import tempfile
    import threading

    say("mmap(PROT_READ|PROT_EXEC)")
    mmap.mmap(-1, 20480, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
              prot=mmap.PROT_READ | mmap.PROT_EXEC).close()
    say("rt_sigreturn")
    signal.signal(signal.SIGUSR1, lambda *a: None)
    os.kill(os.getpid(), signal.SIGUSR1)
    say("clone(a_thread)")
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    say("mkdir")
    tmp = tempfile.mkdtemp(prefix="fp-seccomp-probe-")
    try:
        say("socket(AF_UNIX)")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(os.path.join(tmp, "s"))
            s.listen(1)
            s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.accept()
        say("openat/write/rename")
        path = os.path.join(tmp, "f")
        with open(path, "w") as f:
            f.write("x")
        os.rename(path, path + "2")
        os.unlink(path + "2")
    finally:
        say("unlink")
        shutil.rmtree(tmp, ignore_errors=True)
