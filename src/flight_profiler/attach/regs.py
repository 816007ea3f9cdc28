"""``struct user_regs_struct`` of x86-64: what PTRACE_GETREGS/SETREGS move."""

from __future__ import annotations

import ctypes


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
