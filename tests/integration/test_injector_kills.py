"""The ptrace injector against a tracer that vanishes (issue 19): the CLI SIGKILLed (or stopped,
then killed) at any step of its injection leaves every target alive, untraced and computing
right, with exactly the registers, XSAVE area and signal mask it had."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from flight_profiler.attach import elf_symbols, ptrace
from support import PYTHONS, REPO, spawn

sys.path.insert(0, str(REPO / "bench"))
import bench_injector_kills as kills

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not ptrace.supported(), reason="x86-64 Linux only")]

BY_AGE = sorted(PYTHONS, key=lambda v: tuple(int(x) for x in v.split(".")))


@pytest.mark.timeout(2400)
def test_fifty_aimed_kills_of_the_injector_harm_no_target() -> None:
    # GIVEN targets sleeping, in timed waits and busy, on the oldest and newest Python here,
    # each checking its results, sleeps, signal mask and sigaltstack nonstop
    versions = sorted({BY_AGE[0], BY_AGE[-1]})
    # WHEN the injector is killed 50 times: stopped at a random one of its steps then killed,
    # let go 0-2 ms first (inside a call), stopped then killed, or killed at random
    res = kills.run(50, versions, ["sleeping", "wait", "busy"], list(kills.MODES), seed=19,
                    tracer="fork")
    # THEN not one target died, was left traced or stopped, or computed a wrong result
    assert res.kills == 50
    assert res.deaths == [] and res.harmed == [], res.deaths + res.harmed


SLEEPER = r"""
import os, time
os.write(1, b"READY\n")
while True:
    time.sleep(1000)
"""


def _state(pid: int) -> tuple[bytes, bytes, int]:
    with ptrace.signals_held(), ptrace.Tracee(pid) as tracee:
        return bytes(tracee.saved), tracee._xstate, tracee.sigmask


def _kill_tracer_at(pid: int, step: int, funcs: dict[str, int]) -> str | None:
    """A forked tracer that borrows ``pid``'s main thread for a stub-less and a stub call, and
    is SIGKILLed just before its ``step``-th ptrace request or write. The step's name, or None
    when it finished first."""
    from flight_profiler.attach import sigframe, steps

    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the tracer
        code = 1
        try:
            os.dup2(w, 2)
            steps.PAUSE_AT, steps.count[0] = str(step), 0
            with ptrace.signals_held(), ptrace.Tracee(pid) as tracee:
                base = tracee.call(funcs["mmap"], 0, 4096, 5, 0x22, -1, 0, syscall=9)
                tracee.write(base, sigframe.STUB)
                tracee.stub = base
                tracee.call(funcs["getppid"])
                tracee.stub = None
                tracee.call(funcs["munmap"], base, 4096, syscall=11)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    said = b""
    while True:
        chunk = os.read(r, 4096)
        said += chunk
        m = re.search(rb"fp-paused \d+ (.*)\n", said)
        if m or not chunk:
            break
    os.close(r)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return m.group(1).decode() if m else None


@pytest.mark.timeout(900)
def test_a_tracer_killed_at_any_step_leaves_the_exact_state() -> None:
    # GIVEN a main thread asleep in one long sleep, and its complete state as ptrace reads it
    t = spawn(SLEEPER, python=PYTHONS.get("3.12") or sys.executable)
    try:
        maps = elf_symbols.parse_maps(Path(f"/proc/{t.pid}/maps").read_text())
        libc = elf_symbols.find_libc(elf_symbols.loaded_objects(maps))
        funcs = elf_symbols.resolve(t.pid, libc, ["mmap", "munmap", "getppid"])
        time.sleep(0.2)
        before = _state(t.pid)
        step, seen = 6, []
        while True:
            # WHEN a tracer dies before its step-th request: with the registers set for a call,
            # at the rt_sigreturn entry stop, between the writes of the stub...
            what = _kill_tracer_at(t.pid, step, funcs)
            if what is None:
                break
            seen.append(what)
            time.sleep(0.1)
            # THEN the thread went back into its sleep with every register, the XSAVE area
            # (byte for byte) and the signal mask it had
            assert t.alive(), f"died after a kill before step {step} ({what}): {t.stderr}"
            after = _state(t.pid)
            assert after[0] == before[0], f"registers differ after a kill at step {step} ({what})"
            assert after[1] == before[1], f"XSAVE area differs after a kill at step {step} ({what})"
            assert after[2] == before[2], f"signal mask differs after a kill at step {step} ({what})"
            step += 1
        assert any("SETREGS" in s for s in seen) and any("write" in s for s in seen), seen
        assert t.stderr == ""
    finally:
        t.popen.kill()
        t.popen.wait(10)
