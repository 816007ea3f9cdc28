"""ptrace.Tracee against real processes: calls return, time out, fault and meet signals, and the
borrowed thread always goes on exactly as before."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from flight_profiler.attach import elf_symbols, ptrace, sigframe
from support import Target

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(not ptrace.supported(), reason="x86-64 Linux only")]

SLEEPER = r"""
import os, signal, time
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
print("READY", flush=True)
n = 0
while True:
    t0 = time.monotonic()
    time.sleep(0.05)
    slept = time.monotonic() - t0
    n += 1
    # a sleep cut short or an error from the kernel would show here
    print(f"hb {n} {slept >= 0.045} usr1={len(got)}", flush=True)
"""


def _libc_funcs(pid: int, names: list[str]) -> dict[str, int]:
    maps = elf_symbols.parse_maps(Path(f"/proc/{pid}/maps").read_text())
    return elf_symbols.resolve(pid, elf_symbols.find_libc(elf_symbols.loaded_objects(maps)),
                               names)


def _stub(tracee: ptrace.Tracee, funcs: dict[str, int]) -> int:
    """Map a page holding the return stub, as the injector does (its first call: mmap, which
    returns straight into libc's rt_sigreturn)."""
    base = tracee.call(funcs["mmap"], 0, 4096, 5, 0x22, -1, 0, syscall=9)
    tracee.write(base, sigframe.STUB)
    tracee.stub = base
    return base


def _beats(t: Target) -> list[str]:
    return re.findall(r"^hb \d+ (\w+) usr1=(\d+)$", t.stdout, re.M)


def _advances(t: Target, by: int = 3, timeout: float = 10.0) -> None:
    start = len(_beats(t))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(_beats(t)) >= start + by:
            return
        assert t.alive(), t.stderr
        time.sleep(0.02)
    raise AssertionError("target stopped beating")


def test_call_returns_the_value_and_the_sleep_goes_on(spawn_target) -> None:
    t = spawn_target(SLEEPER)
    funcs = _libc_funcs(t.pid, ["getpid", "getppid", "mmap", "munmap"])
    with ptrace.signals_held(), ptrace.Tracee(t.pid) as tracee:
        assert tracee.syscall in (35, 230, 270, 7, 23)  # parked in a sleep/select
        assert tracee.call(funcs["getpid"], syscall=39) == t.pid  # returns through libc's
        base = _stub(tracee, funcs)
        assert tracee.call(funcs["getppid"]) == os.getpid()  # returns through the stub
        tracee.stub = None
        assert tracee.call(funcs["munmap"], base, 4096, syscall=11) == 0
    _advances(t)
    assert all(ok == "True" for ok, _ in _beats(t)), t.stdout[-500:]
    assert t.stderr == ""


def test_a_call_that_does_not_return_is_abandoned_and_the_thread_restored(spawn_target) -> None:
    t = spawn_target(SLEEPER)
    funcs = _libc_funcs(t.pid, ["sleep"])
    started = time.monotonic()
    with ptrace.signals_held(), ptrace.Tracee(t.pid) as tracee:  # noqa: SIM117
        with pytest.raises(ptrace.CallTimeout):
            tracee.call(funcs["sleep"], 30, timeout=0.5, syscall=230)
    assert time.monotonic() - started < 5
    _advances(t)
    assert t.stderr == ""


def test_a_faulting_call_is_discarded_and_the_target_lives(spawn_target) -> None:
    t = spawn_target(SLEEPER)
    with ptrace.signals_held(), ptrace.Tracee(t.pid) as tracee:  # noqa: SIM117
        with pytest.raises(ptrace.CallCrashed):
            tracee.call(0x1000, syscall=0)  # unmapped: faults at once
    _advances(t)
    assert t.alive() and t.stderr == ""


def test_signals_that_arrive_during_a_call_are_delivered_after_detach(spawn_target) -> None:
    t = spawn_target(SLEEPER)
    funcs = _libc_funcs(t.pid, ["usleep"])
    timer = threading.Timer(0.1, os.kill, (t.pid, signal.SIGUSR1))
    with ptrace.signals_held(), ptrace.Tracee(t.pid) as tracee:
        timer.start()
        tracee.call(funcs["usleep"], 400_000, syscall=230)
        timer.join()
        # blocked in the thread meanwhile: still pending, not lost, not run inside our call
        pending = Path(f"/proc/{t.pid}/task/{t.pid}/status").read_text()
        assert int(re.search(r"SigPnd:\s+(\w+)", pending).group(1), 16) & (1 << 9) or \
            int(re.search(r"ShdPnd:\s+(\w+)", pending).group(1), 16) & (1 << 9)
    deadline = time.monotonic() + 10
    while not any(n == "1" for _, n in _beats(t)):
        assert time.monotonic() < deadline, "SIGUSR1 was lost"
        time.sleep(0.02)
    _advances(t)


def test_the_vector_state_is_restored_exactly(spawn_target) -> None:
    # GIVEN a target whose main thread is stopped: WHEN calls that use vector registers run
    # in it (memset/strlen-like libc code uses AVX), THEN the XSAVE area read back afterwards
    # is byte for byte the one saved before.
    t = spawn_target(SLEEPER)
    funcs = _libc_funcs(t.pid, ["getpid", "qsort", "rand", "mmap", "munmap"])
    with ptrace.signals_held(), ptrace.Tracee(t.pid) as tracee:
        before_regs = bytes(tracee.saved)
        before_x, before_mask = tracee._xstate, tracee.sigmask
        base = _stub(tracee, funcs)
        for _ in range(20):
            tracee.call(funcs["rand"])
        tracee.stub = None
        tracee.call(funcs["munmap"], base, 4096, syscall=11)
        tracee._finish()
        tracee._save_state()  # read back what is now in the thread
        assert bytes(tracee.saved) == before_regs
        assert tracee._xstate == before_x and tracee.sigmask == before_mask
    _advances(t)
