"""The injector's pieces that need no second process: symbol resolution and the x86-64 routines.

The routines are executed for real in this test process (mapped read+exec with mmap, started
with CPython's own PyThread_start_new_thread / Py_AddPendingCall), so an encoding mistake, a
misaligned stack or a wrong table offset fails here, not in a user's job.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from flight_profiler.attach import elf_symbols, ptrace, ptrace_inject
from flight_profiler.attach.process import inspect

pytestmark = pytest.mark.skipif(not ptrace.supported(), reason="x86-64 Linux only")

_libc = ctypes.CDLL(None)


def _addr(fn: object) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def test_resolved_addresses_match_the_dynamic_linker_in_a_live_process() -> None:
    # GIVEN this very process, whose functions ctypes/dlsym can also locate
    target = inspect(os.getpid(), check_permissions=False)
    # WHEN the injector resolves the functions it calls from the ELF files and the maps
    funcs = ptrace_inject.resolve_functions(target)
    # THEN every address is the one the dynamic linker bound
    assert funcs["mmap"] == _addr(_libc.mmap)
    assert funcs["munmap"] == _addr(_libc.munmap)
    assert funcs["__errno_location"] == _addr(_libc.__errno_location)
    for name in ("Py_IsInitialized", "PyGILState_Ensure", "PyGILState_Check",
                 "PyThread_start_new_thread"):
        assert funcs[name] == _addr(getattr(ctypes.pythonapi, name)), name


def test_ifunc_resolvers_are_never_returned_as_functions() -> None:
    # memcpy is a GNU indirect function in glibc: its symbol is the resolver, not memcpy
    maps = elf_symbols.parse_maps(Path("/proc/self/maps").read_text())
    libc = elf_symbols.find_libc(elf_symbols.loaded_objects(maps))
    found = elf_symbols.resolve(os.getpid(), libc, ["memcpy", "getpid"])
    assert "memcpy" not in found
    assert found["getpid"] == _addr(_libc.getpid)


def test_parse_maps_reads_inode_offset_and_deleted_paths() -> None:
    text = ("55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234  /usr/bin/python3.11\n"
            "7f00aa000000-7f00aa100000 r-xp 00001000 fd:01 99 /lib/libc.so.6 (deleted)\n"
            "7f00ab000000-7f00ab001000 rw-p 00000000 00:00 0 \n")
    maps = elf_symbols.parse_maps(text)
    assert [(m.start, m.offset, m.inode) for m in maps] == [
        (0x55D0C0A00000, 0, 1234), (0x7F00AA000000, 0x1000, 99), (0x7F00AB000000, 0, 0)]
    objects = elf_symbols.loaded_objects(maps)
    assert list(objects) == ["/usr/bin/python3.11"]  # libc's line is not at offset 0


class _Region:
    """The injected region, built exactly as the injector builds it, mapped in THIS process."""

    def __init__(self, foreign: str, pending: str, sigmask: int = 0) -> None:
        target = inspect(os.getpid(), check_permissions=False)
        funcs = ptrace_inject.resolve_functions(target)
        self.size = ptrace_inject.region_size(foreign, pending)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
        _libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        base = _libc.mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert base and base != ctypes.c_void_p(-1).value
        self.base = int(base)
        data = ptrace_inject.build_region(self.base, funcs, foreign, pending, sigmask)
        ctypes.memmove(self.base, data, len(data))
        assert _libc.mprotect(ctypes.c_void_p(self.base), self.size,
                              mmap.PROT_READ | mmap.PROT_EXEC) == 0

    def mapped(self) -> bool:
        start = f"{self.base:x}-"
        with open("/proc/self/maps") as f:
            return any(line.startswith(start) for line in f)


def _wait(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_thread_routine_runs_the_text_with_the_gil_then_unmaps_itself() -> None:
    # GIVEN the region, whose "foreign" text records which thread ran it and its signal mask,
    # built for a borrowed thread whose own mask blocks SIGUSR1 and SIGWINCH
    sys.modules[__name__].RAN_IN = None  # type: ignore[attr-defined]
    text = (f"import signal, sys, threading; sys.modules[{__name__!r}].RAN_IN = "
            "(threading.get_ident(), sys._getframe() is not None, "
            "signal.pthread_sigmask(signal.SIG_BLOCK, []))")
    mask = 1 << (signal.SIGUSR1 - 1) | 1 << (signal.SIGWINCH - 1)
    region = _Region(text, "pass", mask)
    start = ctypes.pythonapi.PyThread_start_new_thread
    start.restype = ctypes.c_ulong
    start.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # WHEN a native thread is started on the routine, as the injector does in the target
    ident = start(region.base + ptrace_inject.THREAD_OFF, region.base + ptrace_inject.TABLE_OFF)
    assert ident not in (0, ctypes.c_ulong(-1).value)
    # THEN the text ran in another thread holding the GIL, and the region is gone afterwards
    mod = sys.modules[__name__]
    assert _wait(lambda: mod.RAN_IN is not None)  # type: ignore[attr-defined]
    assert mod.RAN_IN[0] != threading.get_ident() and mod.RAN_IN[1]  # type: ignore[attr-defined]
    # with that thread's own mask, not the one our calls run with (all but faults blocked)
    assert mod.RAN_IN[2] == {signal.SIGUSR1, signal.SIGWINCH}  # type: ignore[attr-defined]
    assert _wait(lambda: not region.mapped())


def test_pending_routine_runs_in_the_main_thread_and_returns_success() -> None:
    sys.modules[__name__].PENDING_RAN = None  # type: ignore[attr-defined]
    text = (f"import sys, threading; sys.modules[{__name__!r}].PENDING_RAN = "
            "threading.get_ident()")
    region = _Region("pass", text)
    add = ctypes.pythonapi.Py_AddPendingCall
    add.restype = ctypes.c_int
    add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    assert add(region.base + ptrace_inject.PENDING_OFF,
               region.base + ptrace_inject.TABLE_OFF) == 0
    mod = sys.modules[__name__]
    # the pending call runs at the next eval-breaker check of this (main) thread; a failure
    # return would raise SystemError here
    assert _wait(lambda: mod.PENDING_RAN is not None)  # type: ignore[attr-defined]
    assert threading.main_thread().ident == mod.PENDING_RAN  # type: ignore[attr-defined]
    assert _wait(lambda: not region.mapped())


def test_region_layout_keeps_texts_apart_and_nul_free() -> None:
    funcs = {n: 0x1000 + i for i, n in enumerate(
        ["PyGILState_Ensure", "PyRun_SimpleString", "PyGILState_Release", "Py_IsInitialized",
         "munmap", "sigprocmask"])}
    data = ptrace_inject.build_region(0x7F0000000000, funcs, "A" * 5000, "B" * 3)
    size = ptrace_inject.region_size("A" * 5000, "B" * 3)
    assert size % 4096 == 0 and len(data) <= size
    assert data[ptrace_inject.TEXT_OFF:ptrace_inject.TEXT_OFF + 5001] == b"A" * 5000 + b"\0"
    assert data.endswith(b"BBB\0")
    with pytest.raises(ValueError, match="NUL"):
        ptrace_inject.build_region(0, funcs, "a\0b", "")


class _StuckThreadStart:
    """A borrowed main thread caught in a system call without the GIL, inside the allocator:
    PyThread_start_new_thread (its first act a malloc) never returns."""

    syscall = 7
    saved = type("Saved", (), {"rax": 0})()
    stub: int | None = None
    sigmask = 0

    def __init__(self, funcs: dict[str, int]) -> None:
        self.funcs = funcs
        self.called: list[str] = []

    def call(self, fn: int, *args: int, timeout: float = 5.0, syscall: int | None = None) -> int:
        name = next(n for n, a in self.funcs.items() if a == fn)
        self.called.append(name)
        if name == "PyThread_start_new_thread":
            raise ptrace.CallTimeout(f"call of {fn:#x} did not return in {timeout:.1f}s")
        return {"__errno_location": 0x1000, "PyGILState_Check": 0, "mmap": 0x7F0000000000,
                "Py_AddPendingCall": 0}.get(name, 0)

    def read(self, addr: int, n: int) -> bytes:
        return b"\0" * n

    def write(self, addr: int, data: bytes) -> None:
        pass


def test_a_thread_start_that_never_returns_falls_back_to_a_pending_call() -> None:
    # CI once saw an attach fail outright on "a call into process N did not return"
    from flight_profiler.attach.outcome import Outcome
    from flight_profiler.attach.process import TargetInfo

    names = ["__errno_location", "PyGILState_Check", "mmap", "munmap", "PyThread_start_new_thread",
             "Py_AddPendingCall", "PyGILState_Ensure", "PyGILState_Release", "PyRun_SimpleStringFlags",
             "Py_IsInitialized", "sigprocmask"]
    funcs = {n: 0x7F1000000000 + 0x100 * i for i, n in enumerate(names)}
    tracee = _StuckThreadStart(funcs)
    target = TargetInfo(pid=os.getpid(), uid=0, state="S", tracer_pid=0, ns_pid=os.getpid(),
                        start_time=0, exe=sys.executable, version=(3, 11), libpython=None, root="/")
    outcome = Outcome(method="none")
    size = ptrace_inject.region_size("pass", "pass")
    ptrace_inject._borrow(tracee, target, funcs, size, "pass", "pass", outcome, 0.1)  # type: ignore[arg-type]
    assert outcome.method == "pending"
    assert outcome.helper_error is not None and "did not return" in outcome.helper_error
    assert tracee.called[-2:] == ["Py_AddPendingCall", "munmap"]  # then the stub's page
