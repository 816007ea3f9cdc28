"""What a trace costs `report` follows its events, not how they nest or what they are named, and
past documented caps a trace is refused with one line (issue 19).

Before: 250 k identical CPU ops (a 79 KB .gz) took 3.9 GB and 88 s of CPU, nested ones 2.0 GB
(each of the 2 000 points an attribution asks about walked the whole nesting and kept it), and
250 k unique 4 KB names 1.4 GB; no cap on decompressed size or events.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from cli_child import report

from flight_profiler.errors import ExitCode
from flight_profiler.report import stacks, trace_loader
from flight_profiler.report.trace_loader import RawTrace, ThreadIntervals

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
from gen_trace import hostile  # noqa: E402

# ------------------------------------------------------------------- cost per event

@pytest.mark.parametrize("shape, events", [("nested", 40_000), ("identical", 40_000),
                                           ("unique-names", 40_000), ("unique-threads", 40_000)])
def test_hostile_shapes_cost_what_their_events_cost(tmp_path: Path, shape: str, events: int) -> None:
    # GIVEN a trace of a hostile shape (gen_trace.SHAPES), tiny once gzipped
    path = tmp_path / f"{shape}.json.gz"
    hostile(str(path), shape, events)
    # WHEN report reads it
    proc, cpu, rss = report(tmp_path, str(path), "--json")
    # THEN it is read, for a cost per event like a real trace's (~2-15 us, ~100-1100 B here):
    # before, identical ops cost 16 KB and 350 us per event, unique 4 KB names 5.7 KB
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert json.loads(proc.stdout)["inputs"][0]["metrics"]["events"] == events
    assert rss < 160, f"peak RSS {rss:.0f} MB for {events} events ({shape})"
    assert cpu < 8.0, f"{cpu:.1f} s CPU for {events} events ({shape})"


def test_nesting_is_recorded_to_a_bounded_depth() -> None:
    # GIVEN one thread of 10 000 operators, each inside the previous one
    th = ThreadIntervals()
    n = 10_000
    for i in range(n):
        th.ts.append(float(i))
        th.end.append(float(2 * n - i))
        th.name.append(0)
        th.kind.append(trace_loader.CPU_OP)
    nested = stacks._nest(th)
    # THEN no span has more than MAX_DEPTH ancestors: a question about a point walks at most that
    depth = [0] * n
    for p in range(n):
        q = nested.parent[p]
        depth[p] = depth[q] + 1 if q >= 0 else 0
    assert max(depth) <= stacks.MAX_DEPTH
    assert depth[stacks.MAX_DEPTH - 1] == stacks.MAX_DEPTH - 1  # real nesting is kept as it is


def test_names_are_interned_within_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_loader, "NAME_BUDGET_CHARS", 100_000)
    monkeypatch.setattr(trace_loader, "MAX_NAMES", 500)
    raw = RawTrace("x")
    # GIVEN one name of 1 MB, then 2 000 distinct names of 4 KB
    huge = raw.intern("k" * (1 << 20))
    ids = [raw.intern(f"{i:08d}" * 512) for i in range(2000)]
    # THEN the same name keeps its id, and what they all cost stays within the budget
    assert raw.intern(f"{7:08d}" * 512) == ids[7]
    assert len(raw.names[huge]) <= trace_loader.MAX_NAME_CHARS + 3
    assert len(raw.names) <= 500 + 1  # and the one name the rest share
    assert sum(map(len, raw.names)) < 100_000 + 4100 + 500 * (trace_loader.SHORT_NAME_CHARS + 3)
    assert raw.names[ids[-1]] == trace_loader.OTHER_NAMES


# ------------------------------------------------------------------------------ caps

def _trace(path: Path, events: int, bare: bool = False) -> Path:
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0 * i,
           "dur": 5.0, "args": {"pad": "x" * 200}} for i in range(events)]
    text = json.dumps(ev if bare else {"traceEvents": ev})
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name, bare", [("t.json", False), ("t.json.gz", False), ("bare.json", True)])
def test_decompressed_size_past_the_cap_is_one_line(tmp_path: Path, name: str, bare: bool) -> None:
    # GIVEN a 2.5 MB trace and a 1 MB cap (the default is 4096 MB); bare: the stdlib reader
    path = _trace(tmp_path / name, 10_000, bare)
    proc, _, _ = report(tmp_path, str(path), env={"FP_REPORT_MAX_TRACE_MB": "1"})
    # THEN one error line names the cap and how to raise it
    assert proc.returncode == ExitCode.BAD_INPUT_FILE, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "more than 1 MB of JSON once decompressed" in line and "FP_REPORT_MAX_TRACE_MB" in line
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name, bare", [("t.json.gz", False), ("bare.json", True)])
def test_events_past_the_cap_are_one_line(tmp_path: Path, name: str, bare: bool) -> None:
    path = _trace(tmp_path / name, 6000, bare)
    proc, _, _ = report(tmp_path, str(path), env={"FP_REPORT_MAX_EVENTS": "5000"})
    assert proc.returncode == ExitCode.BAD_INPUT_FILE, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "more than 5,000 events" in line and "FP_REPORT_MAX_EVENTS" in line
    # and below the caps the same file is read
    proc, _, _ = report(tmp_path, str(path), env={"FP_REPORT_MAX_EVENTS": "6000"})
    assert proc.returncode == ExitCode.OK, proc.stderr


def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    # GIVEN 64 KB of .gz that inflates to 64 MB of whitespace inside the events array
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20) + b"]}", 9))
    proc, cpu, rss = report(tmp_path, str(path), env={"FP_REPORT_MAX_TRACE_MB": "16"})
    assert proc.returncode == ExitCode.BAD_INPUT_FILE, proc.stderr
    assert "more than 16 MB of JSON once decompressed" in proc.stderr
    assert rss < 200 and cpu < 10, (rss, cpu)
