"""Stress loop: many `diagnose --all-ranks` runs against DDP jobs, counting the ranks lost.

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python bench/stress_ddp_diagnose.py \
        --runs 200 --out /tmp/stress [--per-job 1] [--ranks 2] [--mode healthy] [--fr]

Each run diagnoses a DDP job (tests/integration/job_workloads/ddp_trainer.py: DDP model,
DistributedSampler, DataLoader with 2 workers, gloo) with `--method` (default `__main__
train_step`: the profile phase then starts and stops a profiler session around each of the
next calls, in the training thread) or a `--duration 1` window (`--method ""`); with `--per-job 1`
every run gets a freshly started job (the first profile of a process is where kineto starts up),
with more the same job is diagnosed that many times. After each run every rank must still be
alive; a rank that died is recorded with the job log's last lines (a `terminate called ...` or
a signal) and the job is restarted. Unattended: every run is appended to OUT/runs.jsonl as it
ends (a restarted loop skips the runs already there), each step has a time limit, and only the
process groups this script started are stopped. Ctrl-C prints the counts so far.

`--sessions N` runs, instead of diagnose, N profiler sessions per rank (`torch profile METHOD
--schedule 0,N-1,1 --with-stack --profile-memory` on every rank): the start and stop of a
session is where the rank died, so this provokes it ~N/6 times more often per run.

Core dumps: with --cores, ranks run with an unlimited core size in OUT/job-N/ (the kernel's
core_pattern must be a plain name for them to land there), for `gdb python core`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from torchrun_jobs import DDP_TRAINER, Job  # noqa: E402

CLI = [sys.executable, "-m", "flight_profiler"]


def _unlimited_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def diagnose(job: Job, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    cmd = [*CLI, "diagnose", str(job.launcher), "--all-ranks", *args.method.split(), "--out",
           str(out), "--duration", str(args.duration), "--timeout", "15", "--calls",
           str(args.calls), "--json"]
    if args.sessions:
        # Only the profiler's start and stop, many times: N calls of the method each in its own
        # session with stacks and memory, all but the last dropped (warm-up), on every rank.
        out.mkdir(parents=True, exist_ok=True)
        cmd = [*CLI, str(job.launcher), "--all-ranks", "--cmd",
               f"torch profile {args.method} --schedule 0,{args.sessions - 1},1 --with-stack "
               f"--profile-memory --timeout 120 -f {out}/p.json.gz", "--json", "--timeout", "30"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
        rc: int | None = proc.returncode
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout = None, (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = "timed out"
    rec: dict[str, Any] = {"rc": rc, "seconds": round(time.monotonic() - started, 2)}
    try:
        doc = json.loads(stdout)
        rec["failed_phases"] = {r: {k: s for k, s in (v.get("phases") or {}).items()
                                    if s in ("failed", "timed_out")}
                                for r, v in doc.get("ranks", {}).items()}
        rec["job_findings"] = [(f["rule"], f["severity"], f.get("ranks"))
                               for f in doc.get("findings", []) if f["rule"].startswith("job-")]
    except (json.JSONDecodeError, AttributeError):
        rec["stderr"] = stderr[-600:]
    if args.sessions:
        subprocess.run([*CLI, str(job.launcher), "--all-ranks", "--cmd", "detach"],
                       capture_output=True, timeout=120)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--per-job", type=int, default=1, help="diagnoses per started job")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mode", default="healthy")
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--method", default="__main__ train_step",
                    help='what diagnose profiles; "" for a --duration window')
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=0,
                    help="instead of diagnose: this many profiler sessions per rank (the start "
                         "and stop of each, as diagnose's profile phase does per call)")
    ap.add_argument("--fr", action="store_true", help="run the job with Flight Recorder")
    ap.add_argument("--cores", action="store_true", help="let the ranks dump core")
    ap.add_argument("--run-timeout", type=float, default=300.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "runs.jsonl"
    done = len(log.read_text().splitlines()) if log.exists() else 0
    env = {"TORCH_FR_BUFFER_SIZE": "2000"} if args.fr else {}
    counts = {"runs": done, "rank_deaths": 0, "nonzero_exit": 0}
    if done:
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            counts["rank_deaths"] += len(rec.get("dead", []))
            counts["nonzero_exit"] += rec.get("rc") != 0
    job: Job | None = None
    used = 0
    try:
        while counts["runs"] < args.runs:
            n = counts["runs"]
            if job is None or used >= args.per_job:
                if job is not None:
                    job.stop()
                directory = args.out / f"job-{n}"
                directory.mkdir(exist_ok=True)
                cwd = os.getcwd()
                os.chdir(directory)  # where a core would land
                try:
                    if args.cores:
                        _unlimited_cores()
                    job = Job(DDP_TRAINER, args.mode, args.ranks, directory, env)
                finally:
                    os.chdir(cwd)
                used = 0
                try:
                    job.wait_ready()
                except AssertionError as exc:
                    print(f"run {n}: the job did not start: {str(exc)[-300:]}", flush=True)
                    job.stop()
                    job = None
                    time.sleep(5)
                    continue
                time.sleep(1.0)
            assert job is not None
            rec = diagnose(job, args.out / f"diag-{n}", args)
            used += 1
            time.sleep(0.5)  # a rank that aborted on the way out has gone by now
            rec["run"] = n
            rec["dead"] = job.dead_ranks()
            rec["launcher_exited"] = job.popen.poll()
            if rec["dead"] or rec["launcher_exited"] is not None:
                rec["log"] = job.log_tail(4000)
                used = args.per_job  # a fresh job for the next run
            counts["runs"] += 1
            counts["rank_deaths"] += len(rec["dead"])
            counts["nonzero_exit"] += rec["rc"] != 0
            with open(log, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(f"run {n}: rc={rec['rc']} {rec['seconds']}s dead={rec['dead']} "
                  f"findings={rec.get('job_findings')} | totals {counts}", flush=True)
            flagged = [f for f in rec.get("job_findings") or [] if f[1] != "info"]
            if not rec["dead"] and rec["launcher_exited"] is None and not (
                    flagged and args.mode == "healthy"):
                shutil.rmtree(args.out / f"diag-{n}", ignore_errors=True)  # keep the disk
    except KeyboardInterrupt:
        pass
    finally:
        if job is not None:
            job.stop()
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
