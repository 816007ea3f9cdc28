"""What a hostile agent's answer costs the CLI: its peak RSS on big result frames, in one run.

    .venv/bin/python bench/bench_answer_memory.py [--compare /path/to/other/checkout/src]

A fake agent (tests/fake_agent.py, the target itself) answers `status` with one result frame
of a given size, made of one shape ([{},{},...], [[],...], strings, small ints, or one string
with a character beyond Latin-1, stored at four bytes a character); the CLI
(`flight_profiler PID --cmd status`) runs to its end and its peak RSS is read with wait4() by a
small launcher (tests/fake_agent.py: run_cli; ru_maxrss survives exec, so the CLI must not be
forked from a big process). Each line gives the figure and its ratio to the CLI's peak on a normal
answer (the baseline, measured in the same run). Sizes: 100 MB (the frame that took the CLI to
2.6 GB) and, per shape, the largest frame this checkout accepts (the worst allowed frame:
its result cap, or less where the decoded-size cap refuses it first).

``--compare SRC`` runs the same frames with another checkout's sources (e.g. the main branch's)
for a before/after in one run (an old CLI may take minutes on a 100 MB frame).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from fake_agent import FakeAgent, run_cli  # noqa: E402
from flight_profiler.client_frames import LIMITS, decoded_cost  # noqa: E402

UNITS = {"dicts": b"{},", "lists": b"[],", "strings": b'"ab",', "ints": b"7,", "text": b"a"}
HEAD = len(b'{"type":"result","id":1,"data":{"junk":[') + len(b"0]}}")


def largest_allowed(shape: str) -> int:
    """The biggest frame of ``shape`` that passes both caps (binary search on the estimate)."""
    unit = UNITS[shape]
    lo, hi = 1, LIMITS.result_bytes // len(unit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        items = (b'"' + unit * mid + "\U0001f600".encode() + b'",') if shape == "text" else unit * mid
        body = b'{"type":"result","id":1,"data":{"junk":[' + items + b"0]}}"
        if len(body) <= LIMITS.result_bytes and decoded_cost(body) <= LIMITS.decoded_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * len(unit) + HEAD


def peak_rss(src: Path, spec: dict[str, object]) -> tuple[int, int | None, float]:
    """(peak RSS of the CLI in bytes, its exit status, seconds) for one fake agent answer."""
    with FakeAgent(spec) as fake:
        run = run_cli(str(fake.pid), "--cmd", "status", env={"PYTHONPATH": str(src)}, limit=600)
    return run.peak_rss, run.returncode, run.seconds


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
    for name, src in checkouts:
        base = None
        print(f"{name} ({src}):")
        for label, spec in frames:
            rss, code, seconds = peak_rss(src, spec)
            base = base or rss
            print(f"  {label:45} peak RSS {rss / 2**20:8.0f} MiB  x{rss / base:6.1f}  "
                  f"exit {code}  {seconds:6.1f} s", flush=True)


if __name__ == "__main__":
    main()
