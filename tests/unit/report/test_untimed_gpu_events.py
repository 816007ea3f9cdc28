"""GPU events kineto wrote at ts 0 with dur 0 (issue 19, seen on an H100 with torch 2.11).

Exporting a profiler session after a newer one started loses the timestamps of some kernels,
copies and memsets: they are written at ts 0, dur 0, beside CPU events at real timestamps. Kept,
they stretched the GPU span from 0 to the trace's time (4.67e12 us) and the report said "GPU busy
0.0%" (low-gpu-utilization, critical). The loader leaves them out and the report says how many.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from report_synth import gpu_trace

from flight_profiler.render.report_md import render_markdown
from flight_profiler.report import analyze
from flight_profiler.report.trace_loader import load_trace

# The H100 trace's CPU clock: microseconds since boot, ~54 days.
BASE_US = 4.67e12


def _untimed_trace(tmp_path: Path, cpu_at: float) -> tuple[Path, int, int]:
    """A healthy GPU trace (busy > 90%) moved to ``cpu_at``, then every third kernel, every copy
    and an added memset given ts 0, dur 0: (path, untimed GPU events, GPU events)."""
    src = gpu_trace(tmp_path / "src.json.gz", steps=4, kernels_per_step=30, copy_bytes=1 << 20,
                    copy_us=50.0)
    with gzip.open(src, "rt") as fh:
        doc: dict[str, Any] = json.load(fh)
    events = doc["traceEvents"]
    shift = cpu_at - min(e["ts"] for e in events)
    gpu = [e for e in events if e["cat"] in ("kernel", "gpu_memcpy")]
    for e in events:
        e["ts"] += shift
    events.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
                   "ts": 0, "dur": 0, "args": {"device": 0, "stream": 7, "correlation": 1}})
    untimed = 1
    for n, e in enumerate(gpu):
        if e["cat"] == "gpu_memcpy" or n % 3 == 0:
            e["ts"], e["dur"] = 0, 0
            untimed += 1
    path = tmp_path / "untimed.json"
    path.write_text(json.dumps(doc))
    return path, untimed, len(gpu) + 1


def test_untimed_gpu_events_beside_real_cpu_times_are_left_out_and_counted(tmp_path: Path) -> None:
    path, untimed, total = _untimed_trace(tmp_path, BASE_US)
    raw = load_trace(str(path))
    assert (raw.gpu_untimed, raw.gpu_events) == (untimed, total)
    assert len(raw.g_ts) == total - untimed and min(raw.g_ts) >= BASE_US
    assert all(d > 0 for _, d, _, _ in raw.memcpy) or not raw.memcpy

    report = analyze([str(path)])
    (inp,) = report.inputs
    m = inp.data
    assert m["gpu_events_untimed"] == untimed
    note = f"{untimed} of {total} GPU events had no timestamps (ts 0, dur 0) and were left out"
    assert m["notes"] == [note]
    # The GPU span is the timed kernels' (a few ms), not 0 .. 4.67e12 us.
    b = m["gpu_time_breakdown"]
    assert b["span_us"] < 1e5 and b["busy_pct"] > 50
    assert not [f for f in report.findings if f.rule == "low-gpu-utilization"]
    assert "memcpy" not in m  # every copy was untimed
    assert note in render_markdown(report)


def test_gpu_events_at_zero_are_kept_when_the_cpu_side_starts_at_zero(tmp_path: Path) -> None:
    # A trace whose clock starts at 0 (a tool that rebases times): 0 may be a real time.
    path, _, total = _untimed_trace(tmp_path, 0.0)
    raw = load_trace(str(path))
    assert (raw.gpu_untimed, raw.gpu_events, len(raw.g_ts)) == (0, total, total)
    m = analyze([str(path)]).inputs[0].data
    assert "notes" not in m and "gpu_events_untimed" not in m
