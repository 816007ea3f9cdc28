"""The signal frame that makes every call into a borrowed thread undo itself (x86-64 Linux).

A call into the target returns through ``rt_sigreturn``, the system call every signal handler
returns through: the kernel then restores the thread's general registers, its whole XSAVE area
and its signal mask from a frame on the thread's stack, written there before the first register
is changed. So whenever the tracer vanishes (the CLI SIGKILLed at any instant), the thread runs
the call to its end, returns into ``rt_sigreturn`` and goes on exactly where it was stopped.

- The first call (``mmap`` of our region) happens before any code of ours exists in the target:
  it returns into libc's own ``__restore_rt`` (``mov rax, 15; syscall``), found by its bytes.
- Later calls return into a stub in the region that keeps the call's result in ``rdi`` (the
  tracer reads it at the ``rt_sigreturn`` entry stop) and puts ``errno`` back first.
- The frame emulates what the kernel does to an interrupted system call when no signal handler
  runs: ``-ERESTARTSYS``/``-ERESTARTNOHAND``/``-ERESTARTNOINTR`` restart it (``rip`` back over
  the 2-byte ``syscall``, ``rax`` = its number). ``rt_sigreturn`` always cancels a pending
  ``restart_syscall`` (``-ERESTART_RESTARTBLOCK``: relative sleeps and timed futex waits), so
  those return ``-EINTR`` instead, as they would after a signal handler ran.
- ``uc_stack`` carries an invalid mode: the kernel then leaves the thread's sigaltstack alone
  (it ignores every error of that step but EFAULT).

With the tracer alive none of this runs: it stops the thread at the ``rt_sigreturn`` entry,
skips that system call and restores the saved state with ptrace itself (exactly, restart block
included). Everything here is pure data, unit-tested without a second process.
"""

from __future__ import annotations

import os
import struct

from flight_profiler.attach.elf_symbols import Mapping
from flight_profiler.attach.regs import Regs

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Callable

# mov rax, 15; syscall  /  mov eax, 15; syscall: glibc's and musl's __restore_rt
RESTORE_GADGETS = (bytes.fromhex("48c7c00f0000000f05"), bytes.fromhex("b80f0000000f05"))
SYS_RT_SIGRETURN = 15
ENOSYS, EINTR = 38, 4
_ERESTARTSYS, _ERESTARTNOINTR, _ERESTARTNOHAND, _ERESTART_RESTARTBLOCK = 512, 513, 514, 516

_FP_XSTATE_MAGIC1 = 0x46505853
_FP_XSTATE_MAGIC2 = 0x46505845
_SW_BYTES = 464  # offset of the software-reserved bytes in the legacy FXSAVE area
_XSTATE_BV = 512  # offset of the XSAVE header's feature bitmap
_MIN_XSTATE = 576  # legacy area + XSAVE header: the kernel's minimum
_XTILEDATA = 1 << 18  # AMX tile data: 8192 bytes, the last component of the standard layout
_XTILEDATA_SIZE = 8192
UC_FLAGS = 0x1 | 0x2 | 0x4  # UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS
_SS_INVALID_MODE = 3  # neither 0, SS_ONSTACK nor SS_DISABLE: sigaltstack stays as it is

# struct rt_sigframe: pretcode (8), ucontext (304: flags, link, stack_t (24), sigcontext (256),
# sigset (8)), siginfo (128); the XSAVE image follows, 64-byte aligned.
_UCONTEXT = 8
_SIGCONTEXT = _UCONTEXT + 40
_SIGMASK = _SIGCONTEXT + 256
FRAME_SIZE = 8 + 304 + 128
# sigcontext_64 field order (uapi asm/sigcontext.h)
_SC_REGS = ("r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rdi", "rsi", "rbp", "rbx",
            "rdx", "rax", "rcx", "rsp", "rip", "eflags")

# The stub (at the start of our region's first page). Result kept in rdi; errno written back
# when the tracer has filled in its address; then rt_sigreturn with the frame at rsp.
#   mov rdi, rax; mov rcx, [rip+ERRNO_ADDR]; test rcx, rcx; jz 1f
#   mov eax, [rip+ERRNO_VALUE]; mov [rcx], eax
# 1: mov eax, 15; syscall; ud2
STUB = bytes.fromhex(
    "4889c7" "488b0d36000000" "4885c9" "7408"
    "8b0533000000" "8901"
    "b80f000000" "0f05" "0f0b"
)
STUB_END = 30  # address after the syscall: where the rt_sigreturn entry stop reports rip
ERRNO_ADDR = 0x40  # 8 bytes: errno's address in the borrowed thread (0 = not known yet)
ERRNO_VALUE = 0x48  # 4 bytes: its value when the thread was stopped


def find_gadget(code: bytes, base: int) -> int | None:
    """Address of a ``rt_sigreturn`` sequence in ``code`` (mapped at ``base``), if any."""
    for gadget in RESTORE_GADGETS:
        at = code.find(gadget)
        if at >= 0:
            return base + at
    return None


def gadget_end(gadget: int, code: bytes) -> int:
    """Where ``rip`` points at the rt_sigreturn entry stop after the gadget at ``gadget``."""
    for g in RESTORE_GADGETS:
        if code.startswith(g):
            return gadget + len(g)
    raise ValueError("not a rt_sigreturn gadget")


_LIBC_NAME = ("libc.so", "libc-", "ld-musl")
_FOREIGN_STACK_ROOM = 64 << 10  # below the frame, on a stack that is not the main [stack]


def find_in(maps: list[Mapping], read: Callable[[int, int], bytes]) -> tuple[int, int]:
    """(address, end) of a rt_sigreturn sequence in the target's code, libc's first."""
    code = sorted((m for m in maps if m.perms.startswith("r-x") and m.path.startswith("/")),
                  key=lambda m: not os.path.basename(m.path).startswith(_LIBC_NAME))
    for m in code[:8]:
        data = read(m.start, m.end - m.start)
        found = find_gadget(data, m.start)
        if found is not None:
            return found, gadget_end(found, data[found - m.start:])
    raise LookupError("no rt_sigreturn sequence in the target's libc")


def stack_room(maps: list[Mapping], rsp: int, frame: int) -> str | None:
    """Why the stack around ``rsp`` cannot take a frame at ``frame``, or None. Only our writes
    must fit in the mapping: the main [stack] grows on the calls' own faults; a stack the thread
    switched to (a coroutine's) does not, so the calls need room there too."""
    stack = next((m for m in maps if m.start <= rsp - 1 < m.end), None)
    if stack is None or not stack.perms.startswith("rw"):
        return "its stack pointer outside any writable mapping"
    room = 0 if stack.path == "[stack]" else _FOREIGN_STACK_ROOM
    if stack.start > frame - room:
        return (f"only {rsp - stack.start} bytes below its stack pointer, not the "
                f"{rsp - frame + room} a call needs")
    return None


def restarted(saved: Regs) -> Regs:
    """The registers the thread must go on with when it returns through our frame: the saved
    ones, with an interrupted system call restarted as the kernel would without a signal."""
    regs = saved.copy()
    if saved.signed("orig_rax") < 0:
        return regs
    err = -saved.signed("rax")
    if err in (_ERESTARTSYS, _ERESTARTNOINTR, _ERESTARTNOHAND):
        regs.rax = saved.orig_rax
        regs.rip = saved.rip - 2
    elif err == _ERESTART_RESTARTBLOCK:
        regs.rax = (-EINTR) & ((1 << 64) - 1)
    return regs


def fpstate_image(xstate: bytes, xsave: bool) -> bytes:
    """The XSAVE image (from PTRACE_GETREGSET) as ``rt_sigreturn`` accepts it.

    The kernel takes at most the size this process may use: without AMX permission, less than
    the full layout ptrace reports. So AMX tile data in its initial state (never used, or
    released) is left out; every other component is kept whole. The software-reserved bytes
    name the size and features; magic2 follows the image. No XSAVE: the bare FXSAVE area.
    """
    if not xsave:
        image = bytearray(xstate[:512])
        image[_SW_BYTES:512] = bytes(512 - _SW_BYTES)  # magic1 0: a legacy frame
        return bytes(image)
    # ptrace puts the process' XCR0 (the user features the layout holds) in its first 8
    # software-reserved bytes; a signal frame wants struct _fpx_sw_bytes there instead.
    features = struct.unpack_from("<Q", xstate, _SW_BYTES)[0]
    in_use = struct.unpack_from("<Q", xstate, _XSTATE_BV)[0]
    size = len(xstate)
    if features & _XTILEDATA and not in_use & _XTILEDATA and size - _XTILEDATA_SIZE >= _MIN_XSTATE:
        size -= _XTILEDATA_SIZE
        features &= ~_XTILEDATA
    image = bytearray(xstate[:size])
    struct.pack_into("<IIQI", image, _SW_BYTES, _FP_XSTATE_MAGIC1, size + 4, features, size)
    image[_SW_BYTES + 20:512] = bytes(512 - _SW_BYTES - 20)
    return bytes(image) + struct.pack("<I", _FP_XSTATE_MAGIC2)


def layout(rsp: int, gap: int, fp_len: int) -> tuple[int, int]:
    """(frame address, fpstate address) below ``rsp - gap``: the fpstate 64-byte aligned
    above the frame, the frame at 8 mod 16 so that a call entered with rsp there sees the
    stack alignment the ABI promises a function on entry."""
    fp_addr = (rsp - gap - fp_len) & ~63
    frame = ((fp_addr - FRAME_SIZE) & ~15) - 8
    return frame, fp_addr


def build(regs: Regs, sigmask: int, frame: int, fp_addr: int, fpstate: bytes,
          pretcode: int) -> bytes:
    """The bytes from ``frame`` up to the end of the fpstate: what rt_sigreturn reads with
    rsp = frame + 8 to put ``regs`` (already ``restarted``), the mask and the XSAVE image back."""
    out = bytearray(fp_addr - frame + len(fpstate))
    struct.pack_into("<Q", out, 0, pretcode)
    struct.pack_into("<QQQiiQ", out, _UCONTEXT, UC_FLAGS, 0, 0, _SS_INVALID_MODE, 0, 0)
    struct.pack_into("<18Q", out, _SIGCONTEXT, *(int(getattr(regs, r)) for r in _SC_REGS))
    # cs, gs, fs, ss; err, trapno, oldmask, cr2; fpstate pointer; reserved
    struct.pack_into("<4H4QQ", out, _SIGCONTEXT + 144, regs.cs & 0xFFFF, 0, 0,
                     regs.ss & 0xFFFF, 0, 0, 0, 0, fp_addr)
    struct.pack_into("<Q", out, _SIGMASK, sigmask)
    out[fp_addr - frame:] = fpstate
    return bytes(out)
