"""What a hostile agent's answer costs the CLI: its peak RSS on big result frames, in one run.

    .venv/bin/python bench/bench_answer_memory.py [--compare /path/to/other/checkout/src]

A fake agent (tests/fake_agent.py, the target itself) answers `status` with one result frame
of a given size, made of one shape ([{},{},...], [[],...], strings, small ints); the CLI
(`flight_profiler PID --cmd status`, output to /dev/null) runs to its end and its peak RSS is
read with wait4(). Each line gives the figure and its ratio to the CLI's peak on a normal
answer (the baseline, measured in the same run). Sizes: 100 MB (the frame that took the CLI to
2.6 GB) and, per shape, the largest frame this checkout accepts (the worst allowed frame:
its result cap, or less where the decoded-size cap refuses it first).

``--compare SRC`` runs the same frames with another checkout's sources (e.g. the main branch's)
for a before/after in one run (an old CLI may take minutes on a 100 MB frame).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from flight_profiler.client_frames import LIMITS, decoded_cost  # noqa: E402

UNITS = {"dicts": b"{},", "lists": b"[],", "strings": b'"ab",', "ints": b"7,"}
HEAD = len(b'{"type":"result","id":1,"data":{"junk":[') + len(b"0]}}")


def largest_allowed(shape: str) -> int:
    """The biggest frame of ``shape`` that passes both caps (binary search on the estimate)."""
    unit = UNITS[shape]
    lo, hi = 1, LIMITS.result_bytes // len(unit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        body = b'{"type":"result","id":1,"data":{"junk":[' + unit * mid + b"0]}}"
        if len(body) <= LIMITS.result_bytes and decoded_cost(body) <= LIMITS.decoded_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * len(unit) + HEAD


def peak_rss(src: Path, spec: dict[str, object], workdir: Path) -> tuple[int, int, float]:
    """(peak RSS of the CLI in bytes, its exit status, seconds) for one fake agent answer."""
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    fake = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_agent.py"), str(spec_path)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == b"READY"
        env = {**os.environ, "PYTHONPATH": str(src)}
        started = time.monotonic()
        with open(os.devnull, "wb") as null:
            cli = subprocess.Popen([sys.executable, "-m", "flight_profiler", str(fake.pid), "--cmd",
                                    "status"], stdout=null, stderr=null, env=env,
                                   stdin=subprocess.DEVNULL)
            _, status, usage = os.wait4(cli.pid, 0)
        cli.returncode = os.waitstatus_to_exitcode(status)
        return usage.ru_maxrss * 1024, cli.returncode, time.monotonic() - started
    finally:
        fake.terminate()
        fake.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", type=Path, help="another checkout's src/ (before)")
    parser.add_argument("--big", type=int, default=100_000_000, help="bytes of the big frame")
    args = parser.parse_args()
    checkouts = [("this", REPO / "src")] + ([("compare", args.compare)] if args.compare else [])
    frames: list[tuple[str, dict[str, object]]] = [
        ("normal answer", {"requests": [[{"result": {"pid": 1, "uptime_s": 1.0}}]]})]
    frames += [(f"{args.big / 1e6:.0f} MB of {shape}",
                {"requests": [[{"big_result": args.big, "shape": shape}]]}) for shape in ("dicts",)]
    for shape in UNITS:
        size = largest_allowed(shape)
        frames.append((f"{size / 1e6:.1f} MB of {shape} (largest allowed here)",
                       {"requests": [[{"big_result": size, "shape": shape}]]}))
    with tempfile.TemporaryDirectory(prefix="fp-bench-") as tmp:
        for name, src in checkouts:
            base = None
            print(f"{name} ({src}):")
            for label, spec in frames:
                rss, code, seconds = peak_rss(src, spec, Path(tmp))
                base = base or rss
                print(f"  {label:45} peak RSS {rss / 2**20:8.0f} MiB  x{rss / base:6.1f}  "
                      f"exit {code:3}  {seconds:6.1f} s", flush=True)


if __name__ == "__main__":
    main()
