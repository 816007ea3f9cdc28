"""Run fuzz cases (fuzz_cases.py) through `flight_profiler report` and judge each (issue 19).

    python tests/unit/report/fuzz_report.py [--seed 19] [--cases 2000] [--kinds trace,grads]
                                            [--only I] [--keep DIR] [-v]

Cases run one after the other inside child processes (the CLI's own ``main``, in-process there,
stdout and stderr captured), each child under an address-space limit (RLIMIT_AS, LIMIT_BYTES).
A case *holds* when it ends with a report (exit 0, or 9 under --fail-on) or with one clean
error line (exit 8: one ``error:`` line and its ``hint:``; exit 2 for a usage error), prints no
traceback, takes less than MAX_SECONDS of CPU and MAX_WALL_SECONDS of wall time, and its peak RSS
(VmHWM, reset before each case) stays under MAX_RSS_MB. A child that dies or stops answering
fails the case it was running; a fresh child goes on with the next one.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_cases import ENV, KINDS, Case, make_case

LIMIT_BYTES = 1536 << 20
MAX_RSS_MB = 300.0
MAX_SECONDS = 10.0  # CPU
# A shared, loaded machine: wall time is a backstop only ($FP_FUZZ_WALL_S to shorten it).
MAX_WALL_SECONDS = float(os.environ.get("FP_FUZZ_WALL_S", "60"))

_CHILD = r"""
import contextlib, io, json, os, signal, sys, time, traceback
out = os.fdopen(int(sys.argv[1]), "w", buffering=1)

class CaseTimeout(BaseException):
    pass

def _alarm(signum, frame):
    raise CaseTimeout()

signal.signal(signal.SIGALRM, _alarm)
from flight_profiler.cli.main import main

def vm(key):
    with open("/proc/self/status") as st:
        return int(next(line.split()[1] for line in st if line.startswith(key))) / 1024

for line in sys.stdin:
    case = json.loads(line)
    out.write(json.dumps({"start": case["index"]}) + "\n")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    so, se = io.StringIO(), io.StringIO()
    code, exc = 0, None
    t0, c0 = time.perf_counter(), time.process_time()
    signal.alarm(int(case["alarm"]))
    try:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            main(case["args"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except CaseTimeout:
        code, exc = -1, "timeout"
    except BaseException:
        code, exc = -2, traceback.format_exc()
    finally:
        signal.alarm(0)
    text, docs, bad = so.getvalue(), [], None
    if "--json" in case["args"]:  # a sequence of strict JSON documents (the report, an error)
        def strict(tok):
            raise ValueError(f"non-strict JSON token {tok}")
        dec = json.JSONDecoder(parse_constant=strict)
        pos = 0
        try:
            while text[pos:].strip():
                pos += len(text[pos:]) - len(text[pos:].lstrip())
                doc, pos = dec.raw_decode(text, pos)
                docs.append(sorted(doc) if isinstance(doc, dict) else type(doc).__name__)
        except ValueError as e:
            bad = str(e)[:200]
    out.write(json.dumps({"index": case["index"], "code": code, "exc": exc, "json_docs": docs,
                          "json_error": bad, "out": text[:2000], "err": se.getvalue()[:200000],
                          "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                          "rss_mb": vm("VmHWM:")}) + "\n")
"""


def layout(case: Case, root: Path) -> Path:
    d = root / f"case{case.index}"
    d.mkdir()
    for rel, content in case.files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        elif content[0] == "symlink":
            p.symlink_to(content[1])
        elif content[0] == "fifo":
            os.mkfifo(p)
        else:
            p.mkdir()
    return d


def judge(case: Case, r: dict[str, Any]) -> str | None:
    """Why the case did not hold, or None."""
    if r.get("exc") == "timeout":
        return "timed out"
    if r.get("exc"):
        return "traceback: " + r["exc"].strip().splitlines()[-1]
    err, code = r["err"], r["code"]
    if "Traceback" in err or "Traceback" in r["out"]:
        return "traceback in the output"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    fail_on = "--fail-on" in case.args
    if "--json" in case.args:
        # The report as one JSON document; an error as {"error": ...} (after the report for 9).
        docs = r["json_docs"]
        if r["json_error"]:
            return f"--json output is not strict JSON: {r['json_error']}"
        errors = [d for d in docs if d == ["error"]]
        if code in (8, 2) and docs != [["error"]]:
            return f"exit {code} with --json: documents {docs}, stderr {lines[:3]}"
        if code in (0, 9) and (len(docs) - len(errors) != 1 or len(errors) != (code == 9)):
            return f"exit {code} with --json: documents {[d[:3] for d in docs]}"
        if "please report this file" in err + r["out"]:
            return "a file read as 'please report this file'"
        lines = [ln for ln in lines if not ln.startswith("warning:")]
        if code in (8, 2, 9):
            return None if not lines else f"stray stderr lines: {lines[:3]}"
    if code == 8 or code == 2:
        errors = [ln for ln in lines if ln.startswith("error:")]
        others = [ln for ln in lines if not ln.startswith(("error:", "hint:", "warning:", "Usage:", "Try "))]
        if len(errors) != 1 or others:
            return f"exit {code} without exactly one error line: {lines[:4]}"
        if "please report this file" in err:
            return f"unexpected error: {errors[0]}"
    elif code == 0 or (code == 9 and fail_on):
        bad = [ln for ln in lines if not ln.startswith(("warning:", "wrote ", "error: ", "hint:"))]
        if bad:
            return f"exit {code} with stray stderr lines: {bad[:3]}"
        if code == 9 and not any(ln.startswith("error:") for ln in lines):
            return "exit 9 without its error line"
        if "please report this file" in err:
            return "a file read as 'please report this file'"
    else:
        return f"undocumented exit code {code}: {lines[-2:]}"
    if r["cpu"] > MAX_SECONDS or r["wall"] > MAX_WALL_SECONDS:
        return f"took {r['cpu']:.1f} s CPU, {r['wall']:.1f} s wall"
    if r["rss_mb"] > MAX_RSS_MB:
        return f"peak RSS {r['rss_mb']:.0f} MB"
    return None


def run(seed: int, indices: list[int], keep: Path | None = None, verbose: bool = False,
        ) -> list[dict[str, Any]]:
    """Run cases ``indices`` of ``seed``; one result per case: ``kind``, ``case`` (its name),
    ``failure`` (None when it held), exit code, CPU and wall seconds, peak RSS."""
    root = Path(tempfile.mkdtemp(prefix="fp-fuzz-"))
    results: list[dict[str, Any]] = []
    try:
        todo = list(indices)
        while todo:
            results.extend(_child(seed, todo, root, verbose))
    finally:
        if keep is not None:
            shutil.copytree(root, keep, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
    return results


def _child(seed: int, todo: list[int], root: Path, verbose: bool) -> list[dict[str, Any]]:
    """Run cases from the front of ``todo`` (removing them) in one child, until it ends."""
    rfd, wfd = os.pipe()
    env = dict(os.environ, **ENV)
    # FP_FUZZ_SRC: another checkout's src/ (e.g. the code before a fix, to see the cases fail)
    src = os.environ.get("FP_FUZZ_SRC") or str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))

    log = open(root / f"child-{time.monotonic_ns()}.log", "w+")  # noqa: SIM115 - read at its death
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(wfd)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=log, pass_fds=(wfd,),
                            preexec_fn=limit, env=env, cwd=root, text=True)
    os.close(wfd)
    sel = selectors.DefaultSelector()
    sel.register(rfd, selectors.EVENT_READ)
    pending = b""
    out: list[dict[str, Any]] = []
    running: Case | None = None
    assert proc.stdin is not None
    try:
        while todo or running is not None:
            if running is None:
                case = make_case(seed, todo.pop(0))
                d = layout(case, root)
                case.files = {}  # laid out: no need to keep the bytes
                args = [a.replace("{dir}", str(d)) for a in case.args]
                proc.stdin.write(json.dumps({"index": case.index, "args": ["report", *args],
                                             "alarm": MAX_WALL_SECONDS}) + "\n")
                proc.stdin.flush()
                running = case
            chunk: bytes | None = b""
            while b"\n" not in pending:
                chunk = os.read(rfd, 1 << 20) if sel.select(timeout=MAX_WALL_SECONDS + 30) else None
                if not chunk:
                    break
                pending += chunk
            if b"\n" not in pending:
                log.seek(0)
                why = "stopped answering" if chunk is None else f"child died ({proc.wait()}): {log.read()[-300:]}"
                out.append(_failed(running, why))
                running = None
                break
            line, _, pending = pending.partition(b"\n")
            r = json.loads(line)
            if "start" in r:
                continue
            case = running
            r["failure"] = judge(case, r)
            r["case"], r["kind"] = case.name, case.kind
            out.append(r)
            if verbose or r["failure"]:
                print(f"{'HELD' if not r['failure'] else 'FAIL'} {case.name} exit {r['code']} "
                      f"{r['cpu']:.2f}s {r['rss_mb']:.0f}MB {r['failure'] or ''}", flush=True)
            if verbose and r["failure"]:
                print(f"  args: {case.args}\n  stderr: {r['err'][-1500:]!r}\n  stdout: {r['out'][:600]!r}"
                      + (f"\n{r['exc']}" if r.get("exc") else ""), flush=True)
            running = None
    finally:
        proc.kill()
        proc.wait()
        os.close(rfd)
        log.close()
    return out


def _failed(case: Case, why: str) -> dict[str, Any]:
    print(f"FAIL {case.name} {why}", flush=True)
    return {"index": case.index, "case": case.name, "kind": case.kind, "failure": why,
            "code": None, "cpu": 0.0, "wall": 0.0, "rss_mb": 0.0}


def summary(results: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """kind -> (tried, held)."""
    tried: collections.Counter[str] = collections.Counter()
    held: collections.Counter[str] = collections.Counter()
    for r in results:
        tried[r["kind"]] += 1
        held[r["kind"]] += r["failure"] is None
    return {k: (tried[k], held[k]) for k in KINDS if tried[k]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--cases", type=int, default=len(KINDS) * 100)
    p.add_argument("--kinds", help="comma-separated kinds (default: all)")
    p.add_argument("--only", type=int, action="append", help="run case I only (repeatable)")
    p.add_argument("--keep", type=Path, help="copy the cases' files here")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    kinds = set(a.kinds.split(",")) if a.kinds else set(KINDS)
    indices = a.only or [i for i in range(a.cases) if KINDS[i % len(KINDS)] in kinds]
    t0 = time.perf_counter()
    results = run(a.seed, indices, a.keep, a.verbose)
    codes: dict[str, collections.Counter[Any]] = collections.defaultdict(collections.Counter)
    for r in results:
        codes[r["kind"]][r["code"]] += 1
    for k, (tried, held) in summary(results).items():
        exits = ", ".join(f"{c}: {n}" for c, n in sorted(codes[k].items(), key=str))
        print(f"{k:15s} tried {tried:5d} held {held:5d}   (exit codes {exits})")
    failed = [r for r in results if r["failure"]]
    worst_rss = max((r["rss_mb"] for r in results), default=0.0)
    worst_cpu = max((r["cpu"] for r in results), default=0.0)
    print(f"total: tried {len(results)}, held {len(results) - len(failed)}; worst case {worst_cpu:.2f} s CPU, "
          f"{worst_rss:.0f} MB peak RSS; {time.perf_counter() - t0:.0f} s (seed {a.seed})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
