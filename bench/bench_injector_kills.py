"""The aimed kill loop: SIGKILL the CLI at every step of its injection; no target may suffer.

    .venv/bin/python bench/bench_injector_kills.py [--kills 1000] [--pythons 3.9,3.13]
        [--states sleeping,busy,wait] [--modes pause,during,stop,random] [--seed 1] [--json]
        [--src OTHER_CHECKOUT/src]   # the CLI from another checkout (e.g. before a change)
        [--tracer cli|direct|fork]
            cli:    the whole CLI (``flight_profiler PID --cmd status``), as a user runs it;
            direct: a script that runs only the injector, with a bootstrap that does nothing;
            fork:   the same, in a fork of this process (no interpreter start: on a loaded
                    machine starting Python dominates a round). The CI test's variant.

Targets (one per Python version and state, reused from kill to kill) check their own results
nonstop: float sums, a SHA-256 of a buffer, a 1 MB copy (vector code), how long each sleep or
timed wait took, their signal mask and sigaltstack; they print a heartbeat every 0.1 s and
``WRONG``/``EXC`` on any failure.
Each round starts ``flight_profiler PID --cmd status`` with FLIGHT_PROFILER_TEST_PAUSE_AT=k
(attach/ptrace.py: the injector stops itself just before its k-th ptrace request or memory
write) and kills it there:

- ``pause``:  SIGKILL while it is stopped at step k (the tracee sits in whatever state step
  k-1 left it);
- ``during``: SIGCONT, then SIGKILL 0-2 ms later (lands inside a call running in the target);
- ``stop``:   SIGCONT, SIGSTOP 0-2 ms later, SIGKILL 50 ms after that;
- ``random``: no pause; SIGKILL at a random moment 0.05-0.6 s after the CLI started
  (0-50 ms after the injector's start with ``--tracer fork|direct``).

After each kill the target must go on: alive, not traced, not stopped, heartbeats advancing,
no wrong result, nothing on stderr. An agent that came up anyway (the kill landed after the
thread or pending call was started) is detached, so the next round injects again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from flight_profiler.api import NotAttached, connect  # noqa: E402
from flight_profiler.errors import FlightProfilerError  # noqa: E402
from support import PYTHONS, Target, spawn  # noqa: E402

CLI = [sys.executable, "-m", "flight_profiler"]
CLI_SRC: list[str] = []  # --src: PYTHONPATH for the CLI under test
TRACER = ["cli"]
DIRECT = [sys.executable, "-c", "import sys\n"
          "from flight_profiler.attach import process, ptrace_inject\n"
          "t = process.inspect(int(sys.argv[1]), check_permissions=False)\n"
          "ptrace_inject.inject(t, 'pass', 'pass')\n"]
MODES = ("pause", "during", "stop", "random")
STATES = ("sleeping", "busy", "wait")

TARGET = r'''
import ctypes, faulthandler, hashlib, math, os, signal, sys, threading, time
faulthandler.enable()  # gives the main thread a sigaltstack, which must stay as it is
STATE = sys.argv[1]
libc = ctypes.CDLL(None)
def altstack():
    st = (ctypes.c_char * 24)()
    libc.sigaltstack(None, st)
    return bytes(st)
ALTSTACK = altstack()
MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])
DATA = bytes(range(256)) * 4096  # 1 MB
WANT_SHA = hashlib.sha256(DATA).hexdigest()
WANT_SUM = math.fsum(math.sin(i * 0.001) * 1.5 for i in range(500))
event = threading.Event()
def say(line):
    os.write(1, (line + "\n").encode())
def check(n):
    x = 0.0
    for i in range(500):
        x += math.sin(i * 0.001) * 1.5
    if abs(x - WANT_SUM) > 1e-9:
        say(f"WRONG sum {n} {x!r} {WANT_SUM!r}")
    copy = bytearray(DATA)
    if copy != DATA:
        bad = next(i for i in range(len(DATA)) if copy[i] != DATA[i])
        say(f"WRONG copy {n} at {bad}: {bytes(copy[bad:bad + 16]).hex()}")
    elif hashlib.sha256(copy).hexdigest() != WANT_SHA:
        say(f"WRONG sha256 {n}")
    if altstack() != ALTSTACK:
        say(f"WRONG sigaltstack {n}")
    if signal.pthread_sigmask(signal.SIG_BLOCK, []) != MASK:
        say(f"WRONG signal mask {n}")
say("READY")
n = 0
last = 0.0
try:
    while True:
        n += 1
        if STATE == "sleeping":
            t0 = time.monotonic()
            time.sleep(0.02)
            if time.monotonic() - t0 < 0.0195:
                say(f"WRONG short sleep {n} {time.monotonic() - t0:.4f}")
        elif STATE == "wait":
            t0 = time.monotonic()
            if event.wait(0.02):
                say(f"WRONG event set {n}")
            if time.monotonic() - t0 < 0.0195:
                say(f"WRONG short wait {n} {time.monotonic() - t0:.4f}")
        else:
            y = 0
            for i in range(20000):
                y += i
            if y != 199990000:
                say(f"WRONG int {n} {y}")
        if STATE != "busy" or n % 10 == 0:
            check(n)
        now = time.monotonic()
        if now - last >= 0.1:
            last = now
            say(f"hb {n}")
except BaseException as exc:
    say(f"EXC {exc!r}")
    raise
'''


@dataclass
class Variant:
    version: str
    state: str
    target: Target | None = None
    steps: int = 0  # steps of one injection into it, from a "list" run
    names: dict[int, str] = field(default_factory=dict)


@dataclass
class Result:
    kills: int = 0
    missed: int = 0  # the injection ended before step k (fewer steps that time)
    deaths: list[str] = field(default_factory=list)
    harmed: list[str] = field(default_factory=list)  # alive but traced, stopped, stuck or wrong
    by_mode: dict[str, int] = field(default_factory=dict)


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}


def _beats(t: Target) -> int:
    found = re.findall(r"^hb (\d+)$", t.stdout, re.M)
    return int(found[-1]) if found else 0


def health(t: Target, timeout: float = 5.0) -> str | None:
    """None if the target is whole, else what is wrong with it."""
    start = _beats(t)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not t.alive():
            return f"died (exit {t.popen.returncode}); stderr: {t.stderr[-300:]!r}"
        st = _status(t.pid)
        if _beats(t) >= start + 2 and st.get("TracerPid") == "0" \
                and st.get("State", "?")[0] not in "tT":
            break
        time.sleep(0.02)
    else:
        st = _status(t.pid)
        return (f"stuck: heartbeats {start}->{_beats(t)}, TracerPid {st.get('TracerPid')}, "
                f"state {st.get('State')}")
    bad = re.findall(r"^(?:WRONG|EXC).*$", t.stdout, re.M)
    if bad:
        return f"wrong results: {bad[:3]}"
    if t.stderr:
        return f"stderr: {t.stderr[-300:]!r}"
    return None


def detach_agent(pid: int) -> None:
    for _ in range(3):
        try:
            with connect(pid, timeout=5, inject=False) as session:
                session.detach()
            return
        except NotAttached:
            return
        except FlightProfilerError:
            time.sleep(0.2)


class Forked:
    """The injector in a fork of this process, with the bits of Popen the loop uses."""

    def __init__(self, pid: int, pause: str) -> None:
        from flight_profiler.attach import process, ptrace, ptrace_inject

        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # the tracer: dies by our signal, or ends
            code = 1
            try:
                os.dup2(w, 2)
                try:
                    from flight_profiler.attach import steps
                except ImportError:  # --src of a checkout before attach/steps.py existed
                    ptrace._PAUSE_AT, ptrace._steps[0] = pause, 0  # type: ignore[attr-defined]
                else:
                    steps.PAUSE_AT, steps.count[0] = pause, 0
                target = process.inspect(pid, check_permissions=False)
                ptrace_inject.inject(target, "pass", "pass")
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        self.pid = child
        self.stderr = os.fdopen(r, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("injector", timeout)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float) -> tuple[None, bytes]:
        err = self.stderr.read()
        self.wait(timeout)
        return None, err


def _run_cli(pid: int, pause: str) -> subprocess.Popen[bytes] | Forked:
    if TRACER[0] == "fork":
        return Forked(pid, pause)
    env = dict(os.environ, FLIGHT_PROFILER_TEST_PAUSE_AT=pause)
    if CLI_SRC:
        env["PYTHONPATH"] = CLI_SRC[0]
    argv = [*DIRECT, str(pid)] if TRACER[0] == "direct" else [
        *CLI, str(pid), "--cmd", "status", "--timeout", "10", "-v"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)


def _wait_paused(cli: subprocess.Popen[bytes] | Forked, timeout: float = 90.0) -> str | None:
    """The 'fp-paused K what' line once the CLI stopped itself, or None if it ended first."""
    assert cli.stderr is not None
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([cli.stderr], [], [], 0.05)
        if ready:
            chunk = os.read(cli.stderr.fileno(), 65536)
            if not chunk:
                cli.wait(30)
                return None
            buf += chunk
            m = re.search(rb"^fp-paused (\d+ .*)$", buf, re.M)
            if m:
                return m.group(1).decode()
        elif cli.poll() is not None:
            return None
    try:
        wchan = Path(f"/proc/{cli.pid}/wchan").read_text()
    except OSError:
        wchan = "?"
    cli.kill()
    cli.wait(30)
    raise RuntimeError(f"the CLI neither paused nor ended in {timeout:.0f}s (wchan {wchan}); "
                       f"its stderr: {buf.decode(errors='replace')[-1500:]}")


def count_steps(v: Variant) -> None:
    assert v.target is not None
    detach_agent(v.target.pid)
    cli = _run_cli(v.target.pid, "list")
    _, err = cli.communicate(timeout=60)
    for m in re.finditer(r"^fp-step (\d+) (.*)$", err.decode(errors="replace"), re.M):
        v.names[int(m.group(1))] = m.group(2)
    v.steps = max(v.names, default=0)
    detach_agent(v.target.pid)
    if not v.steps:
        raise RuntimeError(f"no injection steps seen: {err.decode(errors='replace')[-800:]}")


def one_kill(v: Variant, mode: str, rng: random.Random, res: Result, log: list[str]) -> None:
    assert v.target is not None
    t = v.target
    k = rng.randint(1, v.steps)
    where = f"{v.version}/{v.state} step {k}"
    if mode == "random":
        cli = _run_cli(t.pid, "")
        time.sleep(rng.uniform(0.05, 0.6) if TRACER[0] == "cli" else rng.uniform(0, 0.05))
        cli.kill()
        where += " (random)"
    else:
        cli = _run_cli(t.pid, str(k))
        paused = _wait_paused(cli)
        if paused is None:
            res.missed += 1
            detach_agent(t.pid)
            return
        where = f"{v.version}/{v.state} {mode} at step {paused}"
        if mode == "pause":
            cli.kill()
        elif mode == "during":
            cli.send_signal(signal.SIGCONT)
            time.sleep(rng.uniform(0, 0.002))
            cli.kill()
        else:
            cli.send_signal(signal.SIGCONT)
            time.sleep(rng.uniform(0, 0.002))
            cli.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            cli.kill()
    cli.wait(30)
    if cli.stderr is not None:
        cli.stderr.close()
    res.kills += 1
    res.by_mode[mode] = res.by_mode.get(mode, 0) + 1
    problem = health(t)
    if problem is None:
        detach_agent(t.pid)
        return
    line = f"{where}: {problem}"
    log.append(line)
    if not t.alive():
        res.deaths.append(line)
    else:
        res.harmed.append(line)
        t.popen.kill()
        t.popen.wait(10)
    v.target = spawn(TARGET, python=PYTHONS[v.version], args=(v.state,))


def run(kills: int, versions: list[str], states: list[str], modes: list[str], seed: int,
        progress: bool = False, tracer: str = "cli") -> Result:
    TRACER[:] = [tracer]
    rng = random.Random(seed)
    variants = [Variant(ver, st) for ver in versions for st in states]
    res = Result()
    log: list[str] = []
    try:
        for v in variants:
            v.target = spawn(TARGET, python=PYTHONS[v.version], args=(v.state,))
            count_steps(v)
        i = 0
        while res.kills < kills:
            v = variants[i % len(variants)]
            mode = modes[(i // len(variants)) % len(modes)]
            i += 1
            one_kill(v, mode, rng, res, log)
            if progress and res.kills and res.kills % 50 == 0:
                print(f"  {res.kills} kills, {len(res.deaths)} deaths, {len(res.harmed)} harmed",
                      file=sys.stderr, flush=True)
    finally:
        for v in variants:
            if v.target is not None:
                v.target.popen.kill()
                v.target.popen.wait(10)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--pythons", default=",".join(PYTHONS))
    parser.add_argument("--states", default=",".join(STATES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--src", help="run the CLI from this src directory instead")
    parser.add_argument("--tracer", choices=("cli", "direct", "fork"), default="cli")
    args = parser.parse_args()
    # a SIGTERM (timeout, Ctrl-C of a wrapper) ends through run()'s finally: no target is left
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    if args.src:
        CLI_SRC.append(os.path.abspath(args.src))
    versions = [v for v in args.pythons.split(",") if v in PYTHONS]
    started = time.monotonic()
    res = run(args.kills, versions, args.states.split(","), args.modes.split(","), args.seed,
              progress=True, tracer=args.tracer)
    out = {"tracer": args.tracer, "kills": res.kills, "by_mode": res.by_mode, "missed_rounds": res.missed,
           "deaths": len(res.deaths), "harmed": len(res.harmed),
           "failures": res.deaths + res.harmed, "pythons": versions,
           "seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{res.kills} kills ({res.by_mode}) on {versions} x {args.states}: "
          f"{len(res.deaths)} deaths, {len(res.harmed)} harmed, in {out['seconds']} s")
    for line in out["failures"]:  # type: ignore[union-attr]
        print("  " + line)


if __name__ == "__main__":
    main()
