"""Time and peak memory of ``flight_profiler report`` on a 1 M-event GPU trace.

    python bench/bench_report.py [--from REAL.json.gz --copies 10 | --events N | --trace PATH]
    FP_HTA_PYTHON=/tmp/hta/bin/python python bench/bench_report.py   # adds HTA and parity
    python bench/bench_report.py --hostile [--events 250000] [--shapes nested,identical]

The trace is, by default, 10 time-shifted copies of a real GPU trace (gpu_train_control from
../shared/fixtures/traces, ~1.09 M events, 300 MB of JSON), else a synthetic one of --events.

Each contender runs in its own process (so peak RSS is its own) on the same file, in one run:
- flight_profiler: ``analyze([trace])`` (streaming load, every metric and rule);
- json.load: the stdlib loading the whole document and nothing else (the floor of any
  load-everything analyser);
- HTA (only if FP_HTA_PYTHON names a Python with HolisticTraceAnalysis installed; it is not a
  dependency): TraceAnalysis + get_temporal_breakdown, HTA_DISABLE_NS_ROUNDING=1.
Machines are shared and noisy: compare the ratios printed at the end, not absolute seconds.

``--hostile``: the report alone on each hostile shape of gen_trace.SHAPES (nested, identical,
unique names ...) and on a realistic synthetic trace of the same event count, in one run, each
in its own process under an address-space limit (--max-gb) and a timeout: time and peak RSS per
event, and their ratios to the realistic trace's (issue 19: the cost must follow the events).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REAL = REPO.parent / "shared" / "fixtures" / "traces" / "gpu_train_control.json.gz"

_MEASURE = """
import json, resource, sys, time
path = sys.argv[1]
t0, c0 = time.perf_counter(), time.process_time()
{body}
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss, "check": check}}))
"""

CONTENDERS = {
    "flight_profiler": (
        "from flight_profiler.report import analyze\n"
        "r = analyze([path])\n"
        "b = r.inputs[0].data.get('gpu_time_breakdown') or {}\n"
        "check = [b.get('idle_pct'), b.get('compute_pct'), b.get('non_compute_pct'), len(r.findings)]"
    ),
    "json.load": (
        "import gzip\n"
        "with (gzip.open(path) if path.endswith('.gz') else open(path, 'rb')) as fh:\n"
        "    doc = json.load(fh)\n"
        "check = len(doc['traceEvents'])"
    ),
    "HTA": (
        "import os\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "ta = TraceAnalysis(trace_files={0: path}, trace_dir=os.path.dirname(path))\n"
        "df = ta.get_temporal_breakdown(visualize=False)\n"
        "check = [float(df[c][0]) for c in ('idle_time_pctg', 'compute_time_pctg',"
        " 'non_compute_time_pctg')]"
    ),
}


def run(python: str, name: str, path: str, timeout: float = 900.0,
        max_bytes: int | None = None) -> dict[str, object]:
    code = _MEASURE.format(body=CONTENDERS[name])
    env = dict(os.environ, HTA_DISABLE_NS_ROUNDING="1",
               PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def limit() -> None:
        if max_bytes:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))

    try:
        proc = subprocess.run([python, "-c", code, path], capture_output=True, text=True,
                              timeout=timeout, env=env, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return {"error": [f"ran past the {timeout:.0f} s timeout"]}
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hostile(events: int, shapes: list[str], timeout: float, max_gb: float) -> None:
    """The report on each hostile shape and on a realistic trace of as many events."""
    sys.path.insert(0, str(HERE))
    from gen_trace import generate
    from gen_trace import hostile as write_shape

    tmp = tempfile.gettempdir()
    files = {}
    for shape in ["realistic", *shapes]:
        path = os.path.join(tmp, f"fp_bench_{shape}_{events}.json.gz")
        if not os.path.exists(path):
            if shape == "realistic":
                generate(path, events)
            else:
                write_shape(path, shape, events)
        files[shape] = path
    tiny = os.path.join(tmp, "fp_bench_identical_10.json.gz")
    write_shape(tiny, "identical", 10)
    floor = run(sys.executable, "flight_profiler", tiny)  # interpreter + imports
    base_mb = float(floor.get("peak_rss_mb", 0.0))  # type: ignore[arg-type]
    print(f"{events} events per file; floor (10 events): {base_mb:.0f} MB peak RSS")
    rows = {}
    for shape, path in files.items():
        r = run(sys.executable, "flight_profiler", path, timeout, int(max_gb * (1 << 30)))
        rows[shape] = r
        gz_kb = os.path.getsize(path) / 1024
        if "error" in r:
            print(f"{shape:15s} {gz_kb:8.0f} KB .gz  failed: {r['error']}")
            continue
        rss, cpu = float(r["peak_rss_mb"]), float(r["cpu_s"])  # type: ignore[arg-type]
        print(f"{shape:15s} {gz_kb:8.0f} KB .gz  wall {float(r['wall_s']):7.2f} s  cpu {cpu:7.2f} s  "  # type: ignore[arg-type]
              f"peak RSS {rss:7.1f} MB  = {(rss - base_mb) * (1 << 20) / events:7.0f} B and "
              f"{cpu * 1e6 / events:6.1f} us per event")
    ref = rows.get("realistic", {})
    if "error" not in ref:
        for shape, r in rows.items():
            if shape != "realistic" and "error" not in r:
                print(f"ratio {shape} / realistic: cpu x{float(r['cpu_s']) / float(ref['cpu_s']):.2f}, "  # type: ignore[arg-type]
                      f"peak RSS above the floor x"
                      f"{(float(r['peak_rss_mb']) - base_mb) / max(float(ref['peak_rss_mb']) - base_mb, 1.0):.2f}")  # type: ignore[arg-type]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--from", dest="source", default=str(REAL) if REAL.exists() else None,
                   help="tile this real trace (default: the shared gpu_train_control fixture)")
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--synthetic", action="store_true", help="generate instead of tiling")
    p.add_argument("--trace", help="use this trace instead of generating one")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--hostile", action="store_true",
                   help="the report alone on the hostile shapes of gen_trace.SHAPES (--events each)")
    p.add_argument("--shapes", help="comma-separated hostile shapes (default: all)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--max-gb", type=float, default=12.0, help="address-space limit per run")
    a = p.parse_args()
    if a.hostile:
        sys.path.insert(0, str(HERE))
        from gen_trace import SHAPES

        hostile(a.events, a.shapes.split(",") if a.shapes else list(SHAPES), a.timeout, a.max_gb)
        return
    path = a.trace
    if path is None:
        sys.path.insert(0, str(HERE))
        from gen_trace import generate, tile

        if a.source and not a.synthetic:
            path = os.path.join(tempfile.gettempdir(), f"fp_bench_tiled_{a.copies}.json")
            if not os.path.exists(path):
                n = tile(path, a.source, a.copies)
                print(f"tiled {a.copies} copies of {a.source}: {n} events, "
                      f"{os.path.getsize(path) >> 20} MiB")
        else:
            path = os.path.join(tempfile.gettempdir(), f"fp_bench_{a.events}.json")
            if not os.path.exists(path):
                n = generate(path, a.events)
                print(f"generated {path} ({n} events, {os.path.getsize(path) >> 20} MiB)")
    names = ["flight_profiler", "json.load"]
    hta = os.environ.get("FP_HTA_PYTHON")
    if hta:
        names.append("HTA")
    results: dict[str, list[dict[str, object]]] = {n: [] for n in names}
    for _ in range(a.repeat):
        for name in names:
            results[name].append(run(hta if name == "HTA" else sys.executable, name, path))
    best = {}
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            print(f"{name:16s} failed: {runs[0].get('error')}")
            continue
        r = min(ok, key=lambda r: float(r["wall_s"]))  # type: ignore[arg-type]
        best[name] = r
        print(f"{name:16s} wall {r['wall_s']:7.2f} s  cpu {r['cpu_s']:7.2f} s  "
              f"peak RSS {r['peak_rss_mb']:7.1f} MB  check {r['check']}")
    ours = best.get("flight_profiler")
    hta_r = best.get("HTA")
    if ours and hta_r:
        pairs = list(zip(ours["check"][:3], hta_r["check"]))  # type: ignore[index]
        diff = max(abs(float(a) - float(b)) for a, b in pairs)
        print(f"HTA parity idle/compute/other: ours {[round(float(a), 2) for a, _ in pairs]} "
              f"HTA {[round(float(b), 2) for _, b in pairs]}: max difference {diff:.2f} pp")
    elif not hta:
        print("HTA: skipped (set FP_HTA_PYTHON to a Python with HolisticTraceAnalysis installed)")
    if ours:
        for name, r in best.items():
            if name != "flight_profiler":
                print(f"ratio {name} / flight_profiler: wall x{float(r['wall_s']) / float(ours['wall_s']):.1f}, "
                      f"cpu x{float(r['cpu_s']) / float(ours['cpu_s']):.1f}, "
                      f"peak RSS x{float(r['peak_rss_mb']) / float(ours['peak_rss_mb']):.1f}")


if __name__ == "__main__":
    main()
