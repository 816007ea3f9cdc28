"""The signal frame every injected call returns through (attach/sigframe.py): its layout against
the kernel's own x86-64 structures, the restart rules, and the XSAVE image rt_sigreturn accepts,
compared with a frame the kernel itself built in this process."""

from __future__ import annotations

import ctypes
import os
import signal
import struct
from pathlib import Path

import pytest

from flight_profiler.attach import elf_symbols, ptrace, sigframe
from flight_profiler.attach.regs import Regs

pytestmark = pytest.mark.skipif(not ptrace.supported(), reason="x86-64 Linux only")


class SigContext(ctypes.Structure):
    """uapi asm/sigcontext.h: struct sigcontext_64."""

    _fields_ = [*((n, ctypes.c_uint64) for n in (
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "di", "si", "bp", "bx", "dx",
        "ax", "cx", "sp", "ip", "flags")),
        ("cs", ctypes.c_uint16), ("gs", ctypes.c_uint16), ("fs", ctypes.c_uint16),
        ("ss", ctypes.c_uint16), ("err", ctypes.c_uint64), ("trapno", ctypes.c_uint64),
        ("oldmask", ctypes.c_uint64), ("cr2", ctypes.c_uint64), ("fpstate", ctypes.c_uint64),
        ("reserved1", ctypes.c_uint64 * 8)]


class StackT(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_uint64), ("ss_flags", ctypes.c_int),
                ("ss_size", ctypes.c_uint64)]


class UContext(ctypes.Structure):
    """asm-generic/ucontext.h as the kernel writes it on x86-64 (sigset: 8 bytes)."""

    _fields_ = [("uc_flags", ctypes.c_uint64), ("uc_link", ctypes.c_uint64),
                ("uc_stack", StackT), ("uc_mcontext", SigContext), ("uc_sigmask", ctypes.c_uint64)]


class RtSigframe(ctypes.Structure):
    _fields_ = [("pretcode", ctypes.c_uint64), ("uc", UContext), ("info", ctypes.c_byte * 128)]


def _regs(**values: int) -> Regs:
    regs = Regs()
    for i, (name, _) in enumerate(Regs._fields_):
        setattr(regs, name, 0x1000 + i)
    for name, value in values.items():
        setattr(regs, name, value & ((1 << 64) - 1))
    return regs


def test_the_frame_has_the_kernels_layout_and_carries_every_register() -> None:
    assert ctypes.sizeof(RtSigframe) == sigframe.FRAME_SIZE
    regs = _regs(cs=0x33, ss=0x2B, eflags=0x246)
    fp = bytes(range(256)) * 3
    frame, fp_addr = sigframe.layout(0x7FFF_FFFF_E000, 256, len(fp))
    data = sigframe.build(regs, 0x1234, frame, fp_addr, fp, pretcode=0x7F00_0000_1000)
    parsed = RtSigframe.from_buffer_copy(data[:sigframe.FRAME_SIZE])
    sc = parsed.uc.uc_mcontext
    assert parsed.pretcode == 0x7F00_0000_1000
    pairs = {"r8": "r8", "r9": "r9", "r10": "r10", "r11": "r11", "r12": "r12", "r13": "r13",
             "r14": "r14", "r15": "r15", "di": "rdi", "si": "rsi", "bp": "rbp", "bx": "rbx",
             "dx": "rdx", "ax": "rax", "cx": "rcx", "sp": "rsp", "ip": "rip", "flags": "eflags"}
    for field, reg in pairs.items():
        assert getattr(sc, field) == getattr(regs, reg), field
    assert (sc.cs, sc.ss, sc.fpstate) == (0x33, 0x2B, fp_addr)
    assert parsed.uc.uc_sigmask == 0x1234
    assert parsed.uc.uc_flags == 0x7  # FP_XSTATE | SIGCONTEXT_SS | STRICT_RESTORE_SS
    # an invalid sigaltstack mode: the kernel's restore of it fails and changes nothing
    assert parsed.uc.uc_stack.ss_flags not in (0, 1, 2)
    assert data[fp_addr - frame:] == fp


def test_layout_keeps_the_red_zone_and_the_alignments() -> None:
    for rsp in (0x7FFF_FFFF_E000, 0x7FFF_FFFF_E008, 0x7FFF_FFFF_DFF3):
        for fp_len in (512, 2444, 11012):
            frame, fp_addr = sigframe.layout(rsp, 256, fp_len)
            assert frame % 16 == 8  # a function entered with rsp here sees the ABI alignment
            assert fp_addr % 64 == 0  # XRSTOR's requirement
            assert frame + sigframe.FRAME_SIZE <= fp_addr
            assert fp_addr + fp_len <= rsp - 256  # below the 128-byte red zone, with room


@pytest.mark.parametrize("rax, restarted", [
    (-512, "restart"), (-513, "restart"), (-514, "restart"),  # ERESTARTSYS/NOINTR/NOHAND
    (-516, "eintr"),  # ERESTART_RESTARTBLOCK: rt_sigreturn cancels restart_syscall
    (-4, "as is"), (7, "as is"),  # a plain error or result: nothing to restart
])
def test_an_interrupted_system_call_is_restarted_as_the_kernel_would(rax: int,
                                                                      restarted: str) -> None:
    saved = _regs(orig_rax=230, rax=rax, rip=0x7F00_0000_2002)
    regs = sigframe.restarted(saved)
    if restarted == "restart":
        assert (regs.rax, regs.rip) == (230, 0x7F00_0000_2000)
    elif restarted == "eintr":
        assert (regs.signed("rax"), regs.rip) == (-4, 0x7F00_0000_2002)
    else:
        assert bytes(regs) == bytes(saved)
    user_code = _regs(orig_rax=-1, rax=-512)
    assert bytes(sigframe.restarted(user_code)) == bytes(user_code)


def _ptrace_image(xcr0: int, in_use: int, size: int) -> bytes:
    """An XSAVE image as PTRACE_GETREGSET(NT_X86_XSTATE) gives it: XCR0 in the first 8
    software-reserved bytes, XSTATE_BV in the header."""
    image = bytearray(os.urandom(size))
    image[464:512] = bytes(48)
    struct.pack_into("<Q", image, 464, xcr0)
    image[512:576] = bytes(64)
    struct.pack_into("<Q", image, 512, in_use)
    return bytes(image)


def test_fpstate_names_the_features_and_size_the_kernel_checks() -> None:
    image = _ptrace_image(0x207, 0x203, 2440)  # x87, SSE, AVX, PKRU (this project's AMD)
    fp = sigframe.fpstate_image(image, xsave=True)
    magic1, extended, features, size = struct.unpack_from("<IIQI", fp, 464)
    assert (magic1, extended, features, size) == (0x46505853, 2444, 0x207, 2440)
    assert fp[:464] == image[:464] and fp[512:2440] == image[512:]
    assert fp[2440:] == struct.pack("<I", 0x46505845)  # FP_XSTATE_MAGIC2


def test_unused_amx_tiles_are_left_out_and_used_ones_kept() -> None:
    xcr0 = 0x602E7  # ... AVX-512, PKRU, XTILECFG, XTILEDATA
    unused = sigframe.fpstate_image(_ptrace_image(xcr0, 0xE7, 11008), xsave=True)
    assert struct.unpack_from("<IIQI", unused, 464) == (0x46505853, 2820, xcr0 & ~(1 << 18),
                                                        2816)
    used = sigframe.fpstate_image(_ptrace_image(xcr0, 0x600E7, 11008), xsave=True)
    assert struct.unpack_from("<IIQI", used, 464) == (0x46505853, 11012, xcr0, 11008)


def test_without_xsave_the_legacy_area_goes_alone() -> None:
    fp = sigframe.fpstate_image(bytes(range(256)) * 2, xsave=False)
    assert len(fp) == 512 and fp[464:] == bytes(48) and fp[:464] == (bytes(range(256)) * 2)[:464]


_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class _SigAction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_uint64 * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


def test_the_software_bytes_match_a_frame_the_kernel_built_here() -> None:
    # GIVEN a signal frame the kernel itself pushed for this very process
    seen: dict[str, object] = {}

    def handler(sig: int, info: int, uc: int) -> None:
        frame = UContext.from_address(uc)
        fp = frame.uc_mcontext.fpstate
        seen["sw"] = struct.unpack_from("<IIQI", ctypes.string_at(fp + 464, 20))
        seen["restorer"] = ctypes.c_uint64.from_address(uc - 8).value  # the pretcode slot

    callback = _HANDLER(handler)
    libc = ctypes.CDLL(None)
    action, old = _SigAction(), _SigAction()
    action.handler = ctypes.cast(callback, ctypes.c_void_p).value
    action.flags = 4  # SA_SIGINFO (glibc adds SA_RESTORER and its __restore_rt)
    assert libc.sigaction(signal.SIGUSR2, ctypes.byref(action), ctypes.byref(old)) == 0
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        libc.sigaction(signal.SIGUSR2, ctypes.byref(old), None)
    magic1, extended, features, size = seen["sw"]  # type: ignore[misc]
    # WHEN our image is built from what ptrace reports for a thread of this machine
    image = _ptrace_image(features, 3, size)
    ours = struct.unpack_from("<IIQI", sigframe.fpstate_image(image, xsave=True), 464)
    # THEN it says what the kernel says (no AMX in use: the kernel's own frames leave it out)
    assert ours == (magic1, extended, features, size)
    # and the restorer glibc gave the kernel is a sequence our search recognises
    maps = elf_symbols.parse_maps(Path("/proc/self/maps").read_text())
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        def read(addr: int, n: int) -> bytes:
            mem.seek(addr)
            return mem.read(n)

        assert sigframe.find_gadget(read(int(seen["restorer"]), 16),  # type: ignore[call-overload]
                                    int(seen["restorer"])) == seen["restorer"]  # type: ignore[call-overload]
        gadget, end = sigframe.find_in(maps, read)
    assert end - gadget in (7, 9)


def test_the_stack_must_hold_the_frame() -> None:
    stack = elf_symbols.Mapping(0x7FFF_0000_0000, 0x7FFF_0002_0000, "rw-p", 0, 0, "[stack]")
    heap = elf_symbols.Mapping(0x5555_0000_0000, 0x5555_0004_0000, "rw-p", 0, 0, "")
    assert sigframe.stack_room([stack], 0x7FFF_0001_0000, 0x7FFF_0000_F000) is None
    assert "bytes below" in str(sigframe.stack_room([stack], 0x7FFF_0000_0800,
                                                     0x7FFF_0000_0000 - 0x100))
    # a coroutine's stack does not grow: the calls need room below the frame as well
    assert sigframe.stack_room([heap], 0x5555_0000_8000, 0x5555_0000_7000) is not None
    assert sigframe.stack_room([heap], 0x5555_0003_0000, 0x5555_0002_F000) is None
    assert sigframe.stack_room([], 0x1000, 0x800) is not None
