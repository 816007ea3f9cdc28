"""Whole-job figures, measured in one run (ratios: machines are noisy).

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python bench/bench_ranks.py [--ranks 4] [--runs 3]

1. `--all-ranks` command latency, N ranks against 1 rank of the same torchrun job (gloo, CPU):
   cold (the agent injected into every rank, then `stack`) and warm (agents running); "cli" rows
   are the whole command (process start, `ps` scan, attach, render). The ranks
   are attached in parallel, so the aim is N ranks < 1.5x one rank. Measured twice: through the
   runner (flight_profiler.attach.multirank) and through the CLI (`PID --all-ranks --cmd stack`).
2. `report` on 8 per-rank traces of ~100 k events each (synthetic gloo traces shaped like
   torch.profiler's): wall time and peak RSS of a fresh `flight_profiler report DIR --json`.
3. `--verdicts [N]`: the job verdict on real DDP jobs (tests/integration/job_workloads/
   ddp_trainer.py, one planted problem per mode), N fresh jobs per mode (3 by default): per run,
   the job finding above info (rule, severity, rank), the line it names, the exit code, the
   wall time of `diagnose PID --all-ranks` and whether every rank is alive afterwards.
   `--method "__main__ train_step"` diagnoses the method's calls instead of a window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests" / "unit" / "report"))

from flight_profiler.attach import multirank, ranks  # noqa: E402

CLI = [sys.executable, "-m", "flight_profiler"]
WORKLOAD = REPO / "examples" / "distributed_job.py"


def start_job(n: int, ready: Path) -> subprocess.Popen[bytes]:
    with open(ready.parent / "job.log", "wb") as log:
        p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                              str(n), "--standalone", str(WORKLOAD), "healthy", str(ready)],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while len(list(ready.glob("rank*"))) < n:
        if time.monotonic() > deadline or p.poll() is not None:
            raise SystemExit("the job did not start: " + (ready.parent / "job.log").read_text()[-2000:])
        time.sleep(0.2)
    return p


def tracers(targets: list[ranks.ProcInfo]) -> dict[int, int]:
    out = {}
    for t in targets:
        with open(f"/proc/{t.pid}/status") as fh:
            for line in fh:
                if line.startswith("TracerPid:") and int(line.split()[1]):
                    out[t.pid] = int(line.split()[1])
    return out


def detach_all(targets: list[ranks.ProcInfo]) -> None:
    """Detach every agent, and wait until no process traces the ranks (a cold attach refuses a
    traced target; on this shared machine something once still traced a rank right after)."""
    multirank.detach_ranks(targets, 20.0)
    deadline = time.monotonic() + 10
    while tracers(targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = tracers(targets)
    if left:
        print(f"warning: still traced after detach: {left}", file=sys.stderr)


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def latency(n: int, runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        ready.mkdir()
        job = start_job(n, ready)
        try:
            targets = ranks.job_of(job.pid, ranks.scan()).ranks
            one = targets[:1]
            stack = {"all": False, "limit": 200}
            res: dict[str, list[float]] = {k: [] for k in ("cold1", "coldN", "warm1", "warmN",
                                                           "cli1", "cliN", "clicold1", "clicoldN")}
            for _ in range(runs):
                detach_all(targets)
                res["cold1"].append(timed(lambda: multirank.request_on_ranks(one, "stack", stack, 30.0)))
                res["warm1"].append(timed(lambda: multirank.request_on_ranks(one, "stack", stack, 30.0)))
                detach_all(targets)
                out = multirank.request_on_ranks(targets, "stack", stack, 30.0)
                assert all(r.ok for r in out), [r.error for r in out]
                detach_all(targets)
                res["coldN"].append(timed(lambda: multirank.request_on_ranks(targets, "stack", stack, 30.0)))
                res["warmN"].append(timed(lambda: multirank.request_on_ranks(targets, "stack", stack, 30.0)))
                res["cli1"].append(timed(lambda: subprocess.run(
                    [*CLI, str(job.pid), "--ranks", "0", "--cmd", "stack", "--json"],
                    capture_output=True, check=True)))
                res["cliN"].append(timed(lambda: subprocess.run(
                    [*CLI, str(job.pid), "--all-ranks", "--cmd", "stack", "--json"],
                    capture_output=True, check=True)))
                detach_all(targets)
                res["clicold1"].append(timed(lambda: subprocess.run(
                    [*CLI, str(job.pid), "--ranks", "0", "--cmd", "stack", "--json"],
                    capture_output=True, check=True)))
                detach_all(targets)
                res["clicoldN"].append(timed(lambda: subprocess.run(
                    [*CLI, str(job.pid), "--all-ranks", "--cmd", "stack", "--json"],
                    capture_output=True, check=True)))
            detach_all(targets)
        finally:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(30)
    return {k: statistics.median(v) for k, v in res.items()}


# `flight_profiler report DIR` in a fresh process that then says its own peak RSS (and its
# loader workers' largest, when it used them): ru_maxrss is per process, in KiB.
_REPORT_RUNNER = """
import json, resource, sys
from flight_profiler.report import analyze
report = analyze([sys.argv[1]])
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"peak_kib": peak, "rules": sorted({f.rule for f in report.findings})}))
"""


def report_bench(n_ranks: int = 8) -> dict[str, float]:
    from job_synth import job_traces  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        compute = [2000.0] * n_ranks
        compute[-1] = 5000.0  # one straggler, so the rules have something to say
        # ~100 k events per rank: steps x (ops + 3)
        paths = job_traces(Path(tmp), compute, steps=490, ops_per_step=200)
        events = sum(len(json.load(__import__("gzip").open(p, "rt"))["traceEvents"]) for p in paths[:1])
        out: dict[str, float] = {"events_per_rank": events,
                                 "bytes_gz_total": sum(p.stat().st_size for p in paths)}
        for jobs in ("1", "0"):
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", _REPORT_RUNNER, tmp], capture_output=True,
                                  text=True, env={**os.environ, "FP_REPORT_JOBS": jobs}, check=True)
            wall = time.perf_counter() - t
            doc = json.loads(proc.stdout)
            label = "serial" if jobs == "1" else "parallel"
            out[f"{label}_seconds"] = wall
            out[f"{label}_peak_mib"] = doc["peak_kib"] / 1024
            out[f"{label}_straggler_found"] = float("job-straggler" in doc["rules"])
        return out


# mode -> (ranks, Flight Recorder on, the verdict expected: (rule, rank) or None for healthy)
VERDICT_JOBS: dict[str, tuple[int, bool, tuple[str, int] | None]] = {
    "healthy": (2, True, None),
    "slow_data": (2, True, ("job-straggler", 1)),
    "slow_compute": (2, False, ("job-straggler", 1)),
    "sleep": (2, False, ("job-straggler", 1)),
    "hang": (2, True, ("job-hang", 1)),
    "skip": (3, True, ("job-desync", 2)),
}


def verdicts(runs: int, modes: list[str], method: str, duration: str) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from torchrun_jobs import DDP_TRAINER, Job  # type: ignore[import-not-found]

    print(f"job verdicts, {runs} fresh job(s) per mode ({'method ' + method if method else 'window'}"
          f", --duration {duration}):")
    for mode in modes:
        n, fr, expected = VERDICT_JOBS[mode]
        right = 0
        for run in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                job = Job(DDP_TRAINER, mode, n, Path(tmp), {"TORCH_FR_BUFFER_SIZE": "2000"} if fr else None)
                try:
                    job.wait_ready()
                    time.sleep(1.5)
                    started = time.perf_counter()
                    proc = subprocess.run(
                        [*CLI, "diagnose", str(job.launcher), "--all-ranks", *method.split(),
                         "--out", str(Path(tmp) / "diag"), "--duration", duration, "--timeout",
                         "20", "--calls", "5", "--json"], capture_output=True, text=True, timeout=600)
                    wall = time.perf_counter() - started
                    time.sleep(0.5)
                    dead = job.dead_ranks()
                finally:
                    job.stop()
                kept = Path(tempfile.mkdtemp(prefix=f"bench-verdict-{mode}-"))
                if (Path(tmp) / "diag").is_dir():
                    shutil.copytree(Path(tmp) / "diag", kept / "diag", dirs_exist_ok=True)
            try:
                doc = json.loads(proc.stdout)
            except json.JSONDecodeError:
                print(f"  {mode:<13} run {run + 1}: no document (exit {proc.returncode}): {proc.stderr[-300:]}")
                continue
            found = [f for f in doc["findings"] if f["rule"].startswith("job-") and f["severity"] != "info"]
            got = [(f["rule"], f["ranks"][0] if f.get("ranks") else None) for f in found]
            ok = (got == [] if expected is None else got == [expected]) and not dead
            right += ok
            named = "-"
            if found:
                f = found[0]
                named = (f.get("metrics") or {}).get("line") or (f.get("where") or ["-"])[0]
            info = [f["title"][:60] for f in doc["findings"] if f["rule"].startswith("job-") and f["severity"] == "info"]
            if ok:
                shutil.rmtree(kept, ignore_errors=True)
            print(f"  {mode:<13} run {run + 1}: {'right' if ok else 'WRONG (kept: ' + str(kept) + ')'} "
                  f"{[f'{r} {f_sev} rank {k}' for (r, k), f_sev in zip(got, [x['severity'] for x in found])]} "
                  f"line {named!r}; exit {doc['exit_code']} ({len(doc.get('missing') or [])} gaps); "
                  f"{wall:.1f} s; dead ranks {dead}" + (f"; info: {info}" if info else ""), flush=True)
        print(f"  {mode:<13} right in {right} of {runs}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--verdicts", type=int, nargs="?", const=3, default=0,
                    help="only the job verdicts on DDP jobs, this many fresh jobs per mode")
    ap.add_argument("--modes", default=",".join(VERDICT_JOBS))
    ap.add_argument("--method", default="", help='e.g. "__main__ train_step" (default: a window)')
    ap.add_argument("--duration", default="1.5")
    args = ap.parse_args()
    if args.verdicts:
        verdicts(args.verdicts, args.modes.split(","), args.method, args.duration)
        return
    if not args.skip_latency:
        lat = latency(args.ranks, args.runs)
        n = args.ranks
        print(f"--all-ranks latency, median of {args.runs} (1 rank vs {n} ranks of one job):")
        for kind in ("cold", "warm", "clicold", "cli"):
            a, b = lat[f"{kind}1"], lat[f"{kind}N"]
            print(f"  {kind:<7} 1 rank {a * 1000:7.1f} ms   {n} ranks {b * 1000:7.1f} ms   "
                  f"ratio {b / a:.2f}x")
    rep = report_bench()
    print(f"report on 8 per-rank traces of {rep['events_per_rank']:.0f} events each "
          f"({rep['bytes_gz_total'] / 2**20:.1f} MiB gzipped):")
    for label in ("serial", "parallel"):
        print(f"  {label:<8} {rep[f'{label}_seconds']:.2f} s, peak RSS "
              f"{rep[f'{label}_peak_mib']:.0f} MiB (largest process), straggler found: "
              f"{bool(rep[f'{label}_straggler_found'])}")


if __name__ == "__main__":
    main()
