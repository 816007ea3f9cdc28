"""diagnose on the realistic programs (tests/integration/real_programs): per program, variant
(healthy / planted mistake) and method (the model's forward, the step, none), N runs each; prints
the verdict of every run (right or wrong, and why), the wall time, the step the diagnosis found
(what it is, how many per second, where the named method sits in it), and the DataLoader's share
of the loop: timed by diagnose without the profiler, in the profile's whole steps, and as the
program itself logs it with no tool attached (amp_classifier, dcgan).

    .venv/bin/python bench/bench_real_programs.py [--repeat 3] [--program NAME ...]
        [--variant healthy|mistake] [--method forward|step|none] [--duration 5] [--calls 10]
        [--phases] [--compare OTHER_TREE/src]

Each run starts the program fresh, waits for its own log line, diagnoses it with the CLI as a
user would (`flight_profiler diagnose PID [target] --json`), checks the program survived, and
stops it. Exit code 1 when any run was wrong.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

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
    ap.add_argument("--compare", metavar="SRC",
                    help="a source tree's src/ (e.g. main's, from `git archive main src`): each run "
                         "diagnoses with its CLI first, then with this one, each on a fresh start")
    ap.add_argument("--phases", action="store_true",
                    help="also print each run's seconds per phase (attach first), and a table of "
                         "their medians per program and method at the end")
    args = ap.parse_args()
    programs = args.program or sorted(cases.PROGRAMS)
    variants = args.variant or ["healthy", "mistake"]
    methods = args.method or ["forward", "step", "none", "all-ranks"]
    # (label, PYTHONPATH): --compare runs the other tree's CLI (and so its agent) just before
    # this one's, on a fresh start of the same program: one run interleaves both.
    trees = [("base", args.compare), ("this", None)] if args.compare else [("", None)]
    right = total = 0
    timings: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="fp-bench-real-") as tmp:
        for name in programs:
            program = cases.PROGRAMS[name]
            for variant in variants:
                for method in methods:
                    if method not in program.targets():
                        continue
                    for run in range(args.repeat):
                        for label, src in trees:
                            out = Path(tmp) / f"{name}-{variant}-{method}-{run}{label}"
                            ok, line, doc = _one_run(program, variant, method, out, args, src)
                            total += 1
                            right += ok
                            print(f"{label + ' ' if label else ''}{line}", flush=True)
                            if args.phases and "error" not in doc:
                                times = _phase_seconds(doc)
                                key = (f"{name}{' ' + label if label else ''}", method)
                                timings.setdefault(key, []).append(times)
                                print("    " + " ".join(f"{k}={v:.1f}" for k, v in times.items()),
                                      flush=True)
    if timings:
        _print_phase_table(timings)
    print(f"\n{right} of {total} right")
    return 0 if right == total else 1


def _one_run(program: cases.Program, variant: str, method: str, out: Path,
             args: argparse.Namespace, src: str | None) -> tuple[bool, str, dict[str, Any]]:
    """Start ``program``, diagnose it once (with the CLI from ``src`` if given), stop it:
    (right, the line to print, diagnose's --json document)."""
    mistake = variant == "mistake"
    log = out.with_name(f"{out.name}.log")
    proc = cases.start(program, mistake, log=log)
    own = cases.steady_dataloader_share(program.name, log)
    saved = os.environ.get("PYTHONPATH")
    try:
        if src is not None:
            os.environ["PYTHONPATH"] = src
        code, doc, seconds = cases.diagnose(
            cases.target_pid(program, proc), program.targets()[method], out,
            ("--duration", str(args.duration), "--calls", str(args.calls),
             *program.options(method)))
        alive = cases.alive(program, proc)
    finally:
        if src is not None:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        cases.stop(proc)
    failed = cases.failed_phases(doc) if "error" not in doc else []
    if "error" in doc:
        ok, why = False, f"exit {code}: {doc['error'][-300:]}"
    else:
        ok, why = cases.judge(program, mistake, doc, own)
    if failed:
        ok, why = False, f"phases failed: {failed}; " + why
    if not alive:
        # the run's directory goes with the bench: the program's own last words are kept
        kept = Path(tempfile.gettempdir()) / f"fp-bench-died-{program.name}-{os.getpid()}-{out.name}.log"
        kept.write_bytes(log.read_bytes() if log.exists() else b"")
        ok, why = False, f"THE PROGRAM DIED (its log: {kept}): " + why
    elif mistake and not ok and program.by_chance and why.startswith("missed"):
        why += f" (seen by chance only: {program.by_chance})"
    step = doc.get("step") or doc.get("diagnose", {}).get("step") or "-"
    dl = doc.get("dataloader") or {}
    share = (f" DataLoader: {dl.get('timed_pct', '-')}% timed, "
             f"{dl.get('profile_pct', '-')}% in the profile, "
             f"{own if own is not None else '-'}% by the program itself"
             if dl or own is not None else "")
    partial = [f"{p.get('name')}: {p.get('reason')}" for p in doc.get("phases") or []
               if str(p.get("reason") or "").startswith("partial")]
    line = (f"{program.name:26s} {variant:8s} {method:8s} run {out.name.rsplit('-', 1)[-1]}: "
            f"{'RIGHT' if ok else 'WRONG'} {seconds:5.1f}s exit {code} "
            f"step={_step(step)}{share}  {why}" + (f"  [{'; '.join(partial)}]" if partial else ""))
    return ok, line, doc


def _phase_seconds(doc: dict[str, Any]) -> dict[str, float]:
    """{attach, each phase, total} in seconds, from diagnose's --json document."""
    times = {"attach": float(doc.get("attach_seconds") or 0.0)}
    for phase in doc.get("phases") or []:
        times[str(phase.get("name"))] = float(phase.get("seconds") or 0.0)
    times["sum"] = sum(times.values())
    return times


def _print_phase_table(timings: dict[tuple[str, str], list[dict[str, float]]]) -> None:
    """Median seconds per phase, one column per program and method (markdown)."""
    keys = list(timings)
    phases: list[str] = []
    for runs in timings.values():
        for times in runs:
            phases += [p for p in times if p not in phases]
    print("\n| phase | " + " | ".join(f"{n} {m}" for n, m in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for phase in phases:
        cells = []
        for key in keys:
            values = [t[phase] for t in timings[key] if phase in t]
            cells.append(f"{statistics.median(values):.1f}" if values else "-")
        print(f"| {phase} | " + " | ".join(cells) + " |")


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
