"""Every loader checks the shape of what the rules and views read, and refuses the rest with one
line naming the file and the field (issue 19: 11 of ~67 mutated gradient-health files ended the
report in a traceback; stacks files, censuses and trace metadata did as well)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from cli_child import error_line, report

from flight_profiler.errors import ExitCode

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GRADS = json.loads((FIXTURES / "agent" / "grads.json").read_text())
STACKS = json.loads((FIXTURES / "ranks" / "stuck" / "stacks" / "stacks_rank0.json").read_text())
CENSUS = json.loads((FIXTURES / "agent" / "census_1.json").read_text())


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the field at ``a.b[0].c`` (every element for ``[*]``)."""
    def apply(doc: dict[str, Any]) -> None:
        parts = path.replace("[", ".[").split(".")
        targets: list[Any] = [doc]
        for part in parts[:-1]:
            nxt: list[Any] = []
            for t in targets:
                if part == "[*]":
                    nxt.extend(t)
                else:
                    nxt.append(t[int(part[1:-1])] if part.startswith("[") else t[part])
            targets = nxt
        last = parts[-1]
        for t in targets:
            if last.startswith("["):
                t[int(last[1:-1])] = value
            elif value is _DELETE:
                del t[last]
            else:
                t[last] = value
    return apply


_DELETE = object()

GRADS_CASES = [
    ("models[0].layers[0].name", _DELETE, "models[0].layers[0].name: expected a string, found null"),
    ("measurements[1].models[1].layers[0]", 3.5,
     "measurements[1].models[1].layers[0]: expected null or a list of 5 figures, found a number"),
    ("measurements[0].models[1].layers[0]", [1, 2], "expected null or a list of 5 figures, found a list"),
    ("measurements[0].models[0]", "x", "measurements[0].models[0]: expected an object, found a string"),
    ("models[1].numel", "many", "models[1].numel: expected a count (an integer >= 0), found a string"),
    ("optimizers", [7], "optimizers[0]: expected an object, found a number"),
    ("optimizers[0].class", 5, "optimizers[0].class: expected a string, found a number"),
    ("zeroing", [1], "zeroing: expected an object, found a list"),
    ("measurements[2].autograd.saved_bytes", "lots", "measurements[2].autograd.saved_bytes: expected a count"),
    ("measurements[*].carried.return", 5, "measurements[0].carried['return']: expected an object, found a number"),
    ("anomaly", {"first": {"op": "aten.log", "forward_stack": 12}},
     "anomaly.first.forward_stack: expected a list, found a number"),
    ("measurements[0].models[1].weight_norms", 5, "measurements[0].models[1].weight_norms: expected a list"),
    ("measurements[0].models[1].grad_norm", [1.0], "measurements[0].models[1].grad_norm: expected a number"),
    ("measurements", {"0": 1}, "measurements: expected a list, found an object"),
    ("version", True, "grads version 'True' is not supported"),
]


@pytest.mark.parametrize("field, value, why", GRADS_CASES, ids=[c[0] for c in GRADS_CASES])
def test_a_misshapen_gradient_health_file_is_one_line_naming_the_field(
        tmp_path: Path, field: str, value: Any, why: str) -> None:
    # GIVEN the torch grads output of a real training step, one field changed
    doc = copy.deepcopy(GRADS)
    _set(field, value)(doc)
    path = tmp_path / "grads.json"
    path.write_text(json.dumps(doc))
    # WHEN report reads it
    proc, _, _ = report(tmp_path, str(path))
    # THEN one error line names the file and the field (before: a traceback)
    line = error_line(proc)
    assert str(path) in line and why in line, line


def test_the_real_gradient_health_file_is_read(tmp_path: Path) -> None:
    proc, _, _ = report(tmp_path, str(FIXTURES / "agent" / "grads.json"), "--json")
    assert proc.returncode == ExitCode.OK, proc.stderr
    rules = {f["rule"] for f in json.loads(proc.stdout)["findings"]}
    assert "grad-health" in rules  # the NaN of its third call


@pytest.mark.parametrize("text, why", [
    ('{"format": "flight_profiler.grads", "version": 1, "models": [], "measurements": [], "time": '
     + "9" * 5000 + "}", "invalid JSON: Exceeds the limit"),
])
def test_unparsable_numbers_are_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(text)
    line = error_line(report(tmp_path, str(path))[0])
    assert why in line and "please report" not in line, line


STACKS_CASES = [
    ("samples[0].threads[0].frames[1].line", "x", "samples[0].threads[0].frames[1].line is not a line number"),
    ("samples[0].threads[0].frames[1].line", float("inf"), "frames[1].line is not a line number"),
    ("samples[1].threads", 5, "samples[1].threads is not a list"),
    ("samples[0].threads[0].frames[0]", 3.0, "samples[0].threads[0].frames[0] is not an object"),
    ("samples[0].threads[0]", "main", "samples[0].threads[0] is not an object"),
    ("samples[0].threads[0].frames", {"a": 1}, "samples[0].threads[0].frames is not a list"),
]


@pytest.mark.parametrize("field, value, why", STACKS_CASES, ids=[f"{c[0]}={c[1]!r}" for c in STACKS_CASES])
def test_a_misshapen_stacks_file_is_one_line_naming_the_field(
        tmp_path: Path, field: str, value: Any, why: str) -> None:
    doc = copy.deepcopy(STACKS)
    _set(field, value)(doc)
    bad = tmp_path / "stacks_rank0.json"
    bad.write_text(json.dumps(doc))
    good = FIXTURES / "ranks" / "stuck" / "stacks" / "stacks_rank1.json"
    # WHEN report reads it beside a good rank: a warning names the field, the rest is read
    proc, _, _ = report(tmp_path, str(bad), str(good), "--json")
    assert proc.returncode == ExitCode.OK, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("warning: ") and str(bad) in line and why in line, line


@pytest.mark.parametrize("field, value, why", [
    ("holders", 5, "'holders' is not a list"),
    ("groups", {"a": 1}, "'groups' is not a list"),
])
def test_a_misshapen_census_is_one_line(tmp_path: Path, field: str, value: Any, why: str) -> None:
    doc = copy.deepcopy(CENSUS)
    doc[field] = value
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    line = error_line(report(tmp_path, str(path))[0])
    assert why in line and "please report" not in line, line


def test_deep_values_in_a_census_row_do_not_reach_the_report(tmp_path: Path) -> None:
    # GIVEN a census whose group rows carry values nested 900 deep (JSON allows it)
    doc = copy.deepcopy(CENSUS)
    deep: Any = 1
    for _ in range(900):
        deep = [deep]
    doc["groups"] = [dict(doc["groups"][0], extra=deep)]
    doc["totals"]["by_device"] = {"cpu": {"count": 1, "nested": deep}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    # THEN it is read (before: RecursionError while writing the report), rows keep their figures
    for args in (["--json"], [], ["--format", "md"]):
        proc, _, _ = report(tmp_path, str(path), *args)
        assert proc.returncode == ExitCode.OK and "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(report(tmp_path, str(path), "--json")[0].stdout)["inputs"][0]["data"]
    assert "extra" not in data["groups"][0] and data["groups"][0]["count"] == doc["groups"][0]["count"]


@pytest.mark.parametrize("meta", [
    {"distributedInfo": {"rank": 1e999}},
    {"distributedInfo": {"rank": [1], "world_size": "4"}},
    {"traceName": [[[["deep"]]]], "deviceProperties": [{"id": {"x": 1}, "name": 7}, 5]},
])
def test_odd_trace_metadata_is_ignored_not_fatal(tmp_path: Path, meta: dict[str, Any]) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0 * i,
               "dur": 5.0} for i in range(20)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**meta, "traceEvents": events}))
    proc, _, _ = report(tmp_path, str(path), "--json")
    assert proc.returncode == ExitCode.OK, proc.stderr
    inp = json.loads(proc.stdout)["inputs"][0]
    assert inp["rank"] is None and inp["metrics"]["events"] == 20


@pytest.mark.parametrize("where, value, why", [
    ("block", 10 ** 400, "a block's size is out of range (a 1329-bit integer)"),
    ("oom", 10 ** 400, "a trace entry's size is out of range (a 1329-bit integer)"),
    ("block", float("nan"), "a block's size is not a number (float)"),
    ("settings", [[[1]]], None),
], ids=["huge-block", "huge-oom", "nan-block", "deep-settings"])
def test_a_snapshot_with_figures_no_device_has_is_one_line(tmp_path: Path, where: str, value: Any,
                                                           why: str | None) -> None:
    from report_synth import snapshot, write_pickle

    doc = snapshot(allocated=[(1 << 20, "train.py", 3)], oom={"size": 8 << 20, "device_free": 1 << 20})
    if where == "block":
        doc["segments"][0]["blocks"][0]["size"] = value
    elif where == "oom":
        doc["device_traces"][0][0]["size"] = value
    else:
        doc["allocator_settings"] = {"roundup_power2_divisions": value, "deep": {"a": {"b": 1}}}
    path = write_pickle(tmp_path / "snap.pickle", doc)
    proc, _, _ = report(tmp_path, str(path), "--json")
    if why is None:  # settings are passed through flat: read, nothing deep in the report
        assert proc.returncode == ExitCode.OK, proc.stderr
        settings = json.loads(proc.stdout)["inputs"][0]["data"]["allocator_settings"]
        assert settings == {"roundup_power2_divisions": [None], "deep": None}
        return
    proc, _, _ = report(tmp_path, str(path))
    line = error_line(proc)
    assert str(path) in line and why in line, line


def test_a_census_figure_past_int64_is_refused_before_a_diff_overflows(tmp_path: Path) -> None:
    # GIVEN a census whose total is 1e308 (finite, but twice it is not): before, `--diff --json`
    # printed "-Infinity", which is not JSON
    doc = copy.deepcopy(CENSUS)
    doc["totals"]["bytes"] = 1e308
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    proc, _, _ = report(tmp_path, "--diff", str(path), str(FIXTURES / "agent" / "census_0.json"))
    line = error_line(proc)
    assert "field 'bytes' is not a finite number" in line, line


@pytest.mark.parametrize("source, field", [
    ("agent/grads.json", "models[0].layers[0].dtype"),
    ("ranks/stuck/stacks/stacks_rank0.json", "samples[0].threads[0].frames[0].locals"),
])
def test_a_value_nested_900_deep_is_one_line_not_a_recursion_error(tmp_path: Path, source: str,
                                                                   field: str) -> None:
    # GIVEN our own file with one field nobody reads nested 900 deep (JSON allows it): before,
    # writing the report out recursed once per level (RecursionError)
    doc = json.loads((FIXTURES / source).read_text())
    deep: Any = 1
    for _ in range(900):
        deep = [deep]
    _set(field, deep)(doc)
    path = tmp_path / Path(source).name
    path.write_text(json.dumps(doc))
    line = error_line(report(tmp_path, str(path), "--format", "md")[0])
    assert "nested more than 32 deep" in line, line
    proc, _, _ = report(tmp_path, str(path), "--json")
    assert proc.returncode == ExitCode.BAD_INPUT_FILE and "Traceback" not in proc.stderr, proc.stderr
    assert "nested more than 32 deep" in json.loads(proc.stdout)["error"]["message"]
