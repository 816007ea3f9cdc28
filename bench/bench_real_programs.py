"""diagnose on the realistic programs (tests/integration/real_programs): per program, variant
(healthy / planted mistake) and method (the model's forward, the step, none), N runs each; prints
the verdict of every run (right or wrong, and why), the wall time, the step the diagnosis found
(what it is, how many per second, where the named method sits in it), and the DataLoader's share
of the loop: timed by diagnose without the profiler, in the profile's whole steps, and as the
program itself logs it with no tool attached (amp_classifier, dcgan).

    .venv/bin/python bench/bench_real_programs.py [--repeat 3] [--program NAME ...]
        [--variant healthy|mistake] [--method forward|step|none] [--duration 5] [--calls 10]

Each run starts the program fresh, waits for its own log line, diagnoses it with the CLI as a
user would (`flight_profiler diagnose PID [target] --json`), checks the program survived, and
stops it. Exit code 1 when any run was wrong.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration" / "real_programs"))

import cases  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--program", action="append", choices=sorted(cases.PROGRAMS))
    ap.add_argument("--variant", action="append", choices=("healthy", "mistake"))
    ap.add_argument("--method", action="append", choices=("forward", "step", "none", "all-ranks"),
                    help="all-ranks: the job as a whole (distributed programs only)")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    programs = args.program or sorted(cases.PROGRAMS)
    variants = args.variant or ["healthy", "mistake"]
    methods = args.method or ["forward", "step", "none", "all-ranks"]
    right = total = 0
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fp-bench-real-") as tmp:
        for name in programs:
            program = cases.PROGRAMS[name]
            for variant in variants:
                mistake = variant == "mistake"
                for method in methods:
                    if method not in program.targets():
                        continue
                    target = program.targets()[method]
                    for run in range(args.repeat):
                        out = Path(tmp) / f"{name}-{variant}-{method}-{run}"
                        log = Path(tmp) / f"{out.name}.log"
                        proc = cases.start(program, mistake, log=log)
                        own = cases.steady_dataloader_share(name, log)
                        try:
                            code, doc, seconds = cases.diagnose(
                                cases.target_pid(program, proc), target, out,
                                ("--duration", str(args.duration), "--calls", str(args.calls),
                                 *program.options(method)))
                            alive = cases.alive(program, proc)
                        finally:
                            cases.stop(proc)
                        failed = cases.failed_phases(doc) if "error" not in doc else []
                        if "error" in doc:
                            ok, why = False, f"exit {code}: {doc['error'][-300:]}"
                        else:
                            ok, why = cases.judge(program, mistake, doc, own)
                        if failed:
                            ok, why = False, f"phases failed: {failed}; " + why
                        if not alive:
                            ok, why = False, "THE PROGRAM DIED: " + why
                        step = doc.get("step") or doc.get("diagnose", {}).get("step") or "-"
                        total += 1
                        right += ok
                        dl = doc.get("dataloader") or {}
                        share = (f" DataLoader: {dl.get('timed_pct', '-')}% timed, "
                                 f"{dl.get('profile_pct', '-')}% in the profile, "
                                 f"{own if own is not None else '-'}% by the program itself"
                                 if dl or own is not None else "")
                        line = (f"{name:26s} {variant:8s} {method:8s} run {run}: "
                                f"{'RIGHT' if ok else 'WRONG'} {seconds:5.1f}s exit {code} "
                                f"step={_step(step)}{share}  {why}")
                        rows.append(line)
                        print(line, flush=True)
    print(f"\n{right} of {total} right")
    return 0 if right == total else 1


def _step(step: object) -> str:
    if not isinstance(step, dict):
        return str(step)
    method = step.get("method") or {}
    rate = step.get("steps_per_s")
    text = f"{step.get('name')}({step.get('kind')}"
    text += f", {rate:g}/s" if rate else ""
    if method.get("role"):
        per = method.get("calls_per_step")
        text += f"; {method.get('name')}: {method['role']}" + (f" x{per:g}" if per else "")
    return text + ")"


if __name__ == "__main__":
    sys.exit(main())
