"""What reaching every node through srun costs, measured in one run (ratios: machines are noisy).

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python bench/bench_job_srun.py [--runs 2]

Needs root and Debian's slurm-wlm + munge (apt-get install -y slurm-wlm munge): it starts the
tests' two-node SLURM on this host (tests/integration/slurm_cluster.py) and sbatch's the DDP
trainer across both nodes (one torchrun and one gloo rank per node). Then, alternately:

- `job srun JOBID -- diagnose --all-ranks`: both nodes at once, streamed back, merged report;
- `diagnose RANKPID --all-ranks --ranks 0`: one node by hand, as before `job srun`.

Printed: the medians, the ratio (aim < 1.5x: the nodes run in parallel), and where the extra
time goes (the slowest node's srun step vs the whole command: squeue, unpacking, the merged
report over both nodes' traces).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import slurm_cluster  # noqa: E402

CLI = [sys.executable, "-m", "flight_profiler"]
TRAINER = REPO / "tests" / "integration" / "job_workloads" / "ddp_trainer.py"
DIAG = ["--duration", "2", "--timeout", "20"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fp-bench-srun-") as tmp:
        root = Path(tmp)
        cluster_gen = slurm_cluster.start(root / "slurm")
        cluster = next(cluster_gen)
        try:
            bench(cluster, root, args.runs)
        finally:
            with contextlib.suppress(StopIteration):
                next(cluster_gen)


def bench(cluster: slurm_cluster.Cluster, root: Path, runs: int) -> None:
    ready = root / "ready"
    ready.mkdir()
    (port,) = slurm_cluster._free_ports(1)
    script = root / "job.sh"
    script.write_text(
        "#!/bin/bash\nsrun --ntasks-per-node=1 bash -c 'exec " + sys.executable
        + " -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID "
        f"--master-addr 127.0.0.1 --master-port {port} {TRAINER} healthy {ready}'\n")
    jobid = cluster.run("sbatch", "--parsable", "-N2", "-o", str(root / "job.out"),
                        str(script)).stdout.strip()
    deadline = time.monotonic() + 180
    while len(list(ready.iterdir())) < 2:
        if time.monotonic() > deadline:
            sys.exit("the DDP job did not start: " + (root / "job.out").read_text()[-2000:])
        time.sleep(1)
    rank0 = int((ready / "rank0").read_text())
    both: list[float] = []
    one: list[float] = []
    steps: list[float] = []
    for i in range(runs):
        out = root / f"srun{i}"
        t = time.monotonic()
        done = subprocess.run([*CLI, "job", "srun", jobid, "--out", str(out), "--json", "--",
                               "diagnose", "--all-ranks", *DIAG], env=cluster.env,
                              capture_output=True, text=True, check=False)
        both.append(time.monotonic() - t)
        doc = json.loads(done.stdout)
        steps.append(max(n["seconds"] for n in doc["nodes"]))
        print(f"run {i}: job srun {both[-1]:.1f} s (exit {done.returncode}, nodes "
              + ", ".join(f"{n['node']} {n['seconds']:.1f} s exit {n['exit_code']}"
                          for n in doc["nodes"]) + ")", flush=True)
        t = time.monotonic()
        done = subprocess.run([*CLI, "diagnose", str(rank0), "--all-ranks", "--ranks", "0",
                               "--out", str(root / f"one{i}"), *DIAG], env=cluster.env,
                              capture_output=True, text=True, check=False)
        one.append(time.monotonic() - t)
        print(f"run {i}: diagnose one node {one[-1]:.1f} s (exit {done.returncode})", flush=True)
    b, o, s = statistics.median(both), statistics.median(one), statistics.median(steps)
    print(f"\njob srun, 2 nodes x 1 rank: {b:.1f} s; diagnose, 1 node x 1 rank: {o:.1f} s; "
          f"ratio {b / o:.2f}x")
    print(f"slowest node's srun step: {s:.1f} s ({s / o:.2f}x one node); the rest "
          f"(squeue, unpacking, merged report): {b - s:.1f} s")


if __name__ == "__main__":
    main()
