"""Start-up of the whole CLI, measured in one run (machines are shared and noisy).

    python bench/bench_cli_startup.py [--runs 10] [--before main] [--fresh 5]
                                      [--target-writes-bytecode]

For each source tree (this checkout, and with ``--before REV`` the src/ of git revision REV,
alternating run by run so that load hits both alike), with bytecode compiled first:
  pass           ``python -c pass``: the interpreter's own floor
  help           ``flight_profiler --help``                                    (target < 0.05 s)
  status         ``flight_profiler PID --cmd status`` with the agent already running
                                                                              (target < 0.08 s)
  status-json    the same with ``--json`` (no table to render)
  first          ``flight_profiler PID --cmd status`` on a fresh target (attach included;
                 ``--fresh`` targets per tree)                                 (target < 0.15 s)
                 The targets run with PYTHONDONTWRITEBYTECODE, as a job of another user than
                 the CLI's cannot write the staged copy's ``__pycache__`` either (root's):
                 ``--target-writes-bytecode`` lets them, as a job of the CLI's own user can.
Medians of wall time and of the child's CPU time (user + system), and which heavy modules each
command imported (``-X importtime``): torch never; rich (and typing, dataclasses: rich imports
them) only to render a table on a terminal (cli/plain_status.py prints status's for a script);
click and the command grammar not for ``PID --cmd status`` (cli/fast_cmd.py); msgspec, the
report engine and the injector not for a command to a running agent.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "rich", "click", "typing", "dataclasses", "msgspec",
         "flight_profiler.requests.grammar", "flight_profiler.report.engine",
         "flight_profiler.attach.inject", "flight_profiler.attach.ptrace_inject",
         "flight_profiler.render")
SLEEPER = "import os, time\nos.write(1, b'READY\\n')\nwhile True:\n    time.sleep(0.05)\n"


def export_revision(rev: str, into: str) -> str:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, child CPU s, stderr) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 and "importtime" not in " ".join(cmd):
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-500:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, done.stderr


def sleeper(writes_bytecode: bool = False) -> subprocess.Popen[bytes]:
    """A target. By default it cannot write bytecode, as a job of another user cannot write the
    ``__pycache__`` of root's staged copy: it compiles whatever agent module it finds no .pyc
    for (``--target-writes-bytecode``: a job of the CLI's own user, which writes them once)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if not writes_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"READY"
    return proc


def heavy_imports(env: dict[str, str], args: list[str]) -> list[str]:
    _, _, err = timed([sys.executable, "-X", "importtime", "-m", "flight_profiler", *args], env)
    names = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    return [h for h in HEAVY if any(n == h or n.startswith(h + ".") for n in names)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--fresh", type=int, default=5, help="fresh targets per tree for `first`")
    parser.add_argument("--before", default="", help="also measure git revision BEFORE's CLI")
    parser.add_argument("--target-writes-bytecode", action="store_true",
                        help="targets may write the agent's .pyc (default: they cannot, as a job "
                             "of another user than the CLI's cannot)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        trees = {"after": str(REPO / "src")}
        if opts.before:
            trees = {"before": export_revision(opts.before, tmp), **trees}
        envs = {}
        for label, src in trees.items():
            subprocess.run([sys.executable, "-m", "compileall", "-q", src], check=True,
                           stdout=subprocess.DEVNULL)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            envs[label] = {**env, "PYTHONPATH": src}
        target = sleeper()
        try:
            pid = str(target.pid)
            cli = [sys.executable, "-m", "flight_profiler"]
            commands = {"pass": [sys.executable, "-c", "pass"], "help": [*cli, "--help"],
                        "status": [*cli, pid, "--cmd", "status"],
                        "status-json": [*cli, pid, "--cmd", "status", "--json"]}
            for label in trees:  # the agent is injected once (by the first tree), then reused
                timed(commands["status"], envs[label])
            runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(opts.runs):
                for name, cmd in commands.items():
                    for label in trees:
                        wall, cpu, _ = timed(cmd, envs[label])
                        runs.setdefault((name, label), []).append((wall, cpu))
            imports = {(name, label): heavy_imports(envs[label], args) for label in trees
                       for name, args in (("help", ["--help"]), ("status", [pid, "--cmd", "status"]),
                                          ("status-json", [pid, "--cmd", "status", "--json"]))}
        finally:
            target.kill()
            target.wait(10)
        for _ in range(opts.fresh):
            for label in trees:
                fresh = sleeper(opts.target_writes_bytecode)
                try:
                    wall, cpu, _ = timed([*cli, str(fresh.pid), "--cmd", "status"], envs[label])
                finally:
                    fresh.kill()
                    fresh.wait(10)
                runs.setdefault(("first", label), []).append((wall, cpu))
    print(f"Python {sys.version.split()[0]}; medians of {opts.runs} runs ({opts.fresh} fresh targets "
          "for `first`), wall s / CPU s" + (f"; before = {opts.before}" if opts.before else "")
          + ("; targets write bytecode" if opts.target_writes_bytecode else ""))
    for name in ("pass", "help", "status", "status-json", "first"):
        if (name, "after") not in runs:  # --fresh 0: no first command measured
            continue
        cells = []
        for label in trees:
            got = runs[(name, label)]
            cells.append(f"{label} {statistics.median(w for w, _ in got):.3f} / "
                         f"{statistics.median(c for _, c in got):.3f}")
        if opts.before:
            ratio = (statistics.median(w for w, _ in runs[(name, "after")])
                     / statistics.median(w for w, _ in runs[(name, "before")]))
            cells.append(f"after/before {ratio:.2f}x")
        print(f"  {name:12s} " + "   ".join(cells))
    for (name, label), found in imports.items():
        print(f"  imports of {name} ({label}): {', '.join(found) or 'none of ' + ', '.join(HEAVY)}")


if __name__ == "__main__":
    main()
