"""What the hardening of issue 10 costs and saves, measured in one run (ratios: machines are noisy).

    .venv/bin/python bench/bench_hardening.py [--runs 20]

Prints:
- bounds: the CLI's refusal of a 1 MB expression against compiling it (what the target's agent
  thread did before, holding the GIL), and a refusal by the agent itself against a `status`;
- reconnect: connect through the private directory's descriptor (open, fstat, SO_PEERCRED)
  against a bare connect to the socket path, on the same live agent;
- sweep: removing what 300 dead processes left (the issue counted 262 lock files);
- heartbeat: a target's loop rate while a client sends it refused 60 KB requests, against idle.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from flight_profiler.agent import limits, protocol  # noqa: E402
from flight_profiler.api import connect  # noqa: E402
from flight_profiler.attach import cleanup  # noqa: E402
from flight_profiler.attach.agent_dir import AgentDir  # noqa: E402
from flight_profiler.client import AgentClient  # noqa: E402

BEATING = r"""
import os, time
os.write(1, b"READY\n")
i = 0
while True:
    i += 1
    if i % 1000 == 0:
        os.write(1, f"hb {i} {time.monotonic()}\n".encode())
    time.sleep(0.0001)
"""


def _median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_bounds(runs: int) -> None:
    from flight_profiler.errors import UsageError
    from flight_profiler.requests.hooks import check_expression

    text = "[" + "1," * 500_000 + "]"  # flat: compiles (a deep one hits RecursionError)

    def refuse() -> None:
        with contextlib.suppress(UsageError):
            check_expression(text, "--expr")

    refused = _median(refuse, runs)
    compiled = _median(lambda: compile(text, "<e>", "eval"), max(1, runs // 10))
    print(f"bounds: refusing a 1 MB expression {refused * 1e3:.2f} ms; compiling it "
          f"{compiled * 1e3:.0f} ms (x{compiled / refused:.0f})")


def _last_beat(out: Path) -> tuple[int, float]:
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("hb ")]
    _, i, t = lines[-1].split()
    return int(i), float(t)


def _rate_during(out: Path, seconds: float, action: Callable[[], object] | None = None) -> float:
    """The target's iterations per second over ``seconds`` while ``action`` runs in a loop."""
    i0, t0 = _last_beat(out)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if action is None:
            time.sleep(0.01)
        else:
            action()
    time.sleep(0.05)  # let the next beat land
    i1, t1 = _last_beat(out)
    return (i1 - i0) / max(t1 - t0, 1e-9)


def bench_live(runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fp-bench-"))
    out = tmp / "out"
    with open(out, "wb") as f:
        target = subprocess.Popen([sys.executable, "-c", BEATING], stdout=f)
    try:
        while b"hb " not in out.read_bytes():
            time.sleep(0.05)
        session = connect(target.pid, timeout=30)
        uid, pid, ns = os.geteuid(), target.pid, protocol.pid_namespace(target.pid)
        start_time = protocol.process_start_time(pid)
        path = protocol.socket_path(pid, uid, pidns=ns)

        def through_dir() -> None:
            with AgentDir.open(uid) as directory:
                AgentClient.connect(directory.via_fd(protocol.socket_name(pid, ns)), pid,
                                    start_time, peer=(pid, uid)).close()

        bare = _median(lambda: AgentClient.connect(path, pid, start_time).close(), runs)
        safe = _median(through_dir, runs)
        print(f"reconnect: through the directory's descriptor {safe * 1e3:.2f} ms, bare "
              f"connect {bare * 1e3:.2f} ms (x{safe / bare:.2f})")

        status = _median(lambda: session.request("status"), runs)
        client = session._client()
        big = {"type": "request", "id": 0, "cmd": "watch",
               "args": {"module": "m", "method": "f", "expr": "x" * (60 * 1024)}}

        def refused() -> None:
            client.sock.sendall(protocol.encode(big))
            protocol.recv(client.sock)

        agent_refusal = _median(refused, runs)
        print(f"bounds: the agent refuses a 60 KB request in {agent_refusal * 1e3:.2f} ms "
              f"(a status takes {status * 1e3:.2f} ms; x{agent_refusal / status:.1f})")

        idle = _rate_during(out, 1.0)
        flooded = _rate_during(out, 1.0, refused)
        print(f"heartbeat: {flooded:.0f} iterations/s while refusing 60 KB requests, "
              f"{idle:.0f} idle (x{flooded / idle:.2f})")
        session.detach()
    finally:
        target.kill()
        target.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def bench_sweep() -> None:
    root = Path(tempfile.mkdtemp(prefix="fp-sweep-"))
    (root / "tmp").mkdir()
    try:
        with AgentDir.open(os.geteuid(), str(root)) as directory:
            dead = []
            for _ in range(300):
                p = subprocess.Popen(["true"])
                p.wait()
                dead.append(p.pid)
            for pid in dead:
                for name in (protocol.socket_name(pid), protocol.log_name(pid),
                             protocol.lock_name(pid)):
                    Path(directory.path, name).write_text("")
            start = time.perf_counter()
            removed = cleanup.sweep(directory)
            took = time.perf_counter() - start
            print(f"sweep: {len(removed)} files of 300 dead processes removed in "
                  f"{took * 1e3:.1f} ms ({took / max(len(removed), 1) * 1e6:.0f} us each)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(f"limits: frame {limits.MAX_REQUEST_BYTES} B, expression {limits.MAX_EXPR_CHARS} "
          f"chars, nesting {limits.MAX_NESTING}")
    bench_bounds(args.runs)
    bench_live(args.runs)
    bench_sweep()


if __name__ == "__main__":
    main()
