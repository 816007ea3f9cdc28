"""Snapshot and census rules: oom, fragmentation, memory-leak over time, graph-retention."""

from __future__ import annotations

import os
from pathlib import Path

from report_synth import census, holder, snapshot, write_json, write_pickle

from flight_profiler.report import Report, analyze

MiB = 1 << 20


def _rules(report: Report, rule: str) -> list:  # type: ignore[type-arg]
    return [f for f in report.findings if f.rule == rule]


def test_oom_entry_gives_sizes_sites_and_fixes(tmp_path: Path) -> None:
    snap = snapshot(allocated=[(6000 * MiB, "train.py", 42), (900 * MiB, "model.py", 7)],
                    inactive=[200 * MiB], oom={"size": 2048 * MiB, "device_free": 300 * MiB})
    (f,) = _rules(analyze([str(write_pickle(tmp_path / "oom.pickle", snap))]), "oom")
    assert f.severity == "critical"
    assert f.metrics["requested"] == 2048 * MiB and f.metrics["device_free"] == 300 * MiB
    assert f.metrics["largest_free_block"] == 200 * MiB
    assert f.metrics["fragmentation"] is False
    assert any("train.py:42" in w for w in f.where)  # biggest live allocation by stack
    assert any("train.py:88" in w for w in f.where)  # where it failed


def test_oom_from_fragmentation_suggests_expandable_segments(tmp_path: Path) -> None:
    snap = snapshot(allocated=[(1000 * MiB, "train.py", 42)], inactive=[300 * MiB] * 4,
                    oom={"size": 512 * MiB, "device_free": 10 * MiB})
    (f,) = _rules(analyze([str(write_pickle(tmp_path / "oom.pickle", snap))]), "oom")
    assert f.metrics["fragmentation"] is True
    assert "expandable_segments" in f.fix[0]


def test_each_oom_is_told_once_across_snapshots_of_one_history(tmp_path: Path) -> None:
    # arm --on oom fired twice: the second snapshot's history ring still holds the first OOM.
    def snap(sizes: list[int], when: float) -> dict:  # type: ignore[type-arg]
        s = snapshot(allocated=[(6000 * MiB, "train.py", 42)], inactive=[10 * MiB],
                     fp={"device_type": "cuda", "pid": 7, "time": when, "label": "oom"})
        s["device_traces"][0] = [
            {"action": "oom", "addr": 0, "size": size * MiB, "stream": 0, "time_us": 100 + i,
             "device_free": 5 * MiB, "frames": [{"filename": "train.py", "line": 88 + i,
                                                  "name": "forward"}]}
            for i, size in enumerate(sizes)]
        return s
    first = write_pickle(tmp_path / "a.pickle", snap([512], 1.0))
    second = write_pickle(tmp_path / "b.pickle", snap([512, 1024], 2.0))
    found = _rules(analyze([str(second), str(first)]), "oom")
    assert sorted(f.metrics["requested"] for f in found) == [512 * MiB, 1024 * MiB]
    (later,) = [f for f in found if f.metrics["requested"] == 1024 * MiB]
    assert later.metrics["earlier_ooms"] == 1
    assert any("1 earlier OOM(s)" in e and "train.py:88" in e for e in later.evidence)
    (alone,) = _rules(analyze([str(second)]), "oom")  # its own history: the latest is the finding
    assert alone.metrics["requested"] == 1024 * MiB


def test_fragmentation_fires_and_says_expandable_segments_is_off(tmp_path: Path) -> None:
    snap = snapshot(allocated=[(8 * MiB, "train.py", 5)] * 100, inactive=[20 * MiB] * 100)
    (f,) = _rules(analyze([str(write_pickle(tmp_path / "frag.pickle", snap))]), "fragmentation")
    assert f.metrics["ratio"] > 2.5 and f.metrics["inactive_split_blocks"] == 100
    assert f.metrics["expandable_segments"] is False
    assert "expandable_segments is off" in f.fix[0]


def test_no_fragmentation_on_a_tight_snapshot_or_cpu_form(tmp_path: Path) -> None:
    tight = snapshot(allocated=[(512 * MiB, "train.py", 5)] * 4, inactive=[16 * MiB])
    cpu = snapshot(allocated=[(8 * MiB, "train.py", 5)] * 10, inactive=[800 * MiB], split=False,
                   fp={"device_type": "cpu", "pid": 1, "time": 1.0, "label": "x"})
    report = analyze([str(write_pickle(tmp_path / "a.pickle", tight)),
                      str(write_pickle(tmp_path / "b.pickle", cpu))])
    assert all(i.ok for i in report.inputs)
    assert _rules(report, "fragmentation") == [] and _rules(report, "oom") == []


def test_legacy_forms_are_read(tmp_path: Path) -> None:
    seg = {"device": 0, "address": 0, "total_size": 4 * MiB, "allocated_size": 2 * MiB,
           "blocks": [{"size": 2 * MiB, "state": "active_allocated",
                       "history": [{"real_size": 2 * MiB,
                                    "frames": [{"filename": "old.py", "line": 9, "name": "f"}]}]},
                      {"size": 2 * MiB, "state": "inactive"}]}
    report = analyze([str(write_pickle(tmp_path / "legacy.pickle", [seg]))])
    (inp,) = report.inputs
    assert inp.ok, inp.error
    assert inp.data["allocated"] == 2 * MiB and inp.data["reserved"] == 4 * MiB
    assert inp.data["sites"][0]["site"].startswith("old.py:9")


def test_growth_across_snapshots_names_the_growing_site(tmp_path: Path) -> None:
    paths = []
    for k in range(3):
        snap = snapshot(allocated=[(100 * MiB, "model.py", 7)] + [(50 * MiB, "train.py", 42)] * (k + 1),
                        fp={"device_type": "cuda", "pid": 77, "time": 1000.0 + k, "label": f"t{k}"})
        paths.append(write_pickle(tmp_path / f"s{k}.pickle", snap))
    # mtimes in the opposite order: flight_profiler.time must win
    for n, p in enumerate(reversed(paths)):
        os.utime(p, (2000 + n, 2000 + n))
    report = analyze([str(p) for p in reversed(paths)])
    (f,) = _rules(report, "memory-leak")
    assert f.severity == "critical"
    assert f.metrics["allocated"] == [150 * MiB, 200 * MiB, 250 * MiB]
    assert "train.py:42" in f.where[0]


def test_torch_snapshots_without_our_key_are_ordered_by_mtime(tmp_path: Path) -> None:
    paths = []
    for k in range(2):
        snap = snapshot(allocated=[(50 * MiB, "train.py", 42)] * (k + 1))
        p = write_pickle(tmp_path / f"z{k}.pickle", snap)
        os.utime(p, (1000 + k, 1000 + k))
        paths.append(p)
    (f,) = _rules(analyze([str(paths[1]), str(paths[0])]), "memory-leak")
    assert f.metrics["allocated"] == [50 * MiB, 100 * MiB]


def test_stable_snapshots_raise_no_leak(tmp_path: Path) -> None:
    paths = [write_pickle(tmp_path / f"s{k}.pickle",
                          snapshot(allocated=[(100 * MiB, "model.py", 7)],
                                   fp={"device_type": "cuda", "pid": 5, "time": float(k), "label": ""}))
             for k in range(3)]
    assert _rules(analyze([str(p) for p in paths]), "memory-leak") == []


def _census_series(tmp_path: Path, counts: list[int], grad: bool) -> list[str]:
    out = []
    for k, n in enumerate(counts):
        c = census(9, 100.0 + k, [
            holder("__main__.losses[*]", n, n * 4 * MiB, grad=n if grad else 0,
                   graph=n * 2 * MiB if grad else 0),
            holder("__main__.model._parameters[*]", 4, 40 * MiB)], label=f"c{k}")
        out.append(str(write_json(tmp_path / f"c{k}.json", c)))
    return out


def test_graph_retention_and_leak_across_censuses(tmp_path: Path) -> None:
    report = analyze(_census_series(tmp_path, [10, 40, 80], grad=True))
    (g,) = _rules(report, "graph-retention")
    assert g.severity == "critical" and g.metrics["holder"] == "__main__.losses[*]"
    assert g.metrics["with_grad_fn"] == [10, 40, 80]
    assert any("loss.item()" in fix for fix in g.fix)
    (leak,) = _rules(report, "memory-leak")
    assert leak.metrics["growing_holders"][0] == "__main__.losses[*]"


def test_one_census_with_a_list_of_graphs_is_a_warning(tmp_path: Path) -> None:
    c = census(9, 1.0, [holder("__main__.history[*]", 120, 120 * MiB, grad=120, graph=300 * MiB)])
    (g,) = _rules(analyze([str(write_json(tmp_path / "c.json", c))]), "graph-retention")
    assert g.severity == "warning" and "__main__.history[*]" in g.where[0]


def test_stable_censuses_and_detached_growth_are_not_graph_retention(tmp_path: Path) -> None:
    stable = analyze(_census_series(tmp_path, [10, 10, 10], grad=True))
    assert _rules(stable, "graph-retention") == []
    assert _rules(stable, "memory-leak") == []
    detached = analyze(_census_series(tmp_path, [10, 40, 80], grad=False))
    assert _rules(detached, "graph-retention") == []
    assert len(_rules(detached, "memory-leak")) == 1


def test_census_with_unknown_version_is_refused(tmp_path: Path) -> None:
    c = census(1, 1.0, [])
    c["version"] = 99
    (inp,) = analyze([str(write_json(tmp_path / "c.json", c))]).inputs
    assert not inp.ok and "version" in inp.error


AGENT = Path(__file__).resolve().parents[2] / "fixtures" / "agent"


def test_files_written_by_the_agent_code_are_diagnosed() -> None:
    # Censuses and CPU snapshots made by flight_profiler.agent while a module-level list kept
    # every step's loss (tests/fixtures/make_fixtures.py agent_outputs).
    report = analyze(sorted(str(p) for p in AGENT.iterdir()))
    assert all(i.ok for i in report.inputs), [i.error for i in report.errors]
    (g,) = _rules(report, "graph-retention")
    assert g.metrics["holder"] == "__main__.LOSSES[*]" and g.severity == "critical"
    leaks = _rules(report, "memory-leak")
    assert {tuple(sorted({Path(p).suffix for p in f.inputs})) for f in leaks} == {(".json",), (".pickle",)}
    census_leak = next(f for f in leaks if f.inputs[0].endswith(".json"))
    assert census_leak.metrics["growing_holders"][0] == "__main__.LOSSES[*]"
    snaps = [i for i in report.inputs if i.kind == "snapshot"]
    assert [s.data["device_type"] for s in snaps] == ["cpu"] * 3


def test_a_loss_in_flight_is_not_graph_retention(tmp_path: Path) -> None:
    # Seen on a real run: the census catches the current step's loss (1 -> 2 tensors).
    paths = [str(write_json(tmp_path / f"c{k}.json",
                            census(3, float(k), [holder("<unreached>", 1 + k, 8 * (k + 1), grad=1 + k,
                                                        kind="unknown")])))
             for k in range(2)]
    assert _rules(analyze(paths), "graph-retention") == []


def _inference_cache_censuses(tmp_path: Path, folded: bool) -> list[str]:
    """An inference server caching model outputs WITH grad under one key per request."""
    paths = []
    for n, requests in enumerate((20, 60, 110)):
        if folded:
            rows = [holder("__main__._RESULT_CACHE[*]", requests, requests * 32 * 1024,
                           grad=requests, graph=requests * 800 * 1024, kind="dict")]
        else:
            rows = [holder(f"__main__._RESULT_CACHE['req-{880 + i}']", 1, 32 * 1024, grad=1,
                           graph=800 * 1024, kind="dict") for i in range(requests)]
        paths.append(str(write_json(tmp_path / f"c{folded}{n}.json", census(7, 10.0 + n, rows))))
    return paths


def test_inference_outputs_kept_with_graphs_are_graph_retention_fixed_with_no_grad(
        tmp_path: Path) -> None:
    for folded in (True, False):
        report = analyze(_inference_cache_censuses(tmp_path, folded))
        (g,) = _rules(report, "graph-retention")
        # One finding for the container (per-key censuses are folded), not one per request
        assert g.metrics["holder"] == "__main__._RESULT_CACHE[*]"
        assert "torch.inference_mode()" in g.fix[0] and "torch.no_grad()" in g.fix[0]
        (leak,) = _rules(report, "memory-leak")
        assert len(leak.where) == 1 and "20 -> 110 tensors" in leak.where[0]
        assert "autograd graph" in leak.fix[0]


def test_a_loss_history_keeps_the_item_fix_first(tmp_path: Path) -> None:
    rows = [census(3, 1.0 + n, [holder("main() local trainer.history[*]", k, 4 * k, grad=k,
                                       graph=k * 2 * MiB)])
            for n, k in enumerate((10, 40, 80))]
    report = analyze([str(write_json(tmp_path / f"l{n}.json", c)) for n, c in enumerate(rows)])
    (g,) = _rules(report, "graph-retention")
    assert "`main() local trainer.history[*]`" in g.fix[0] and "loss.item()" in g.fix[0]


def test_recordings_stay_out_of_memory_over_time_and_gaps_are_said(tmp_path: Path) -> None:
    # GIVEN what the seed's phases produce by hand: two snapshots of a flat process and a `-r`
    # recording in between whose "allocated" is only what a few calls allocated
    def snap(name: str, t: float, mib: int, calls: int | None = None) -> str:
        fp = {"device_type": "cpu", "pid": 77, "time": t, "label": name}
        if calls is not None:
            fp["calls"] = calls
        return str(write_pickle(tmp_path / f"{name}.pickle",
                                snapshot(allocated=[(mib * MiB, "train.py", 5)], fp=fp)))

    paths = [snap("before", 1.0, 100), snap("record", 2.0, 3, calls=10), snap("after", 3.0, 100)]
    report = analyze(paths)
    # THEN the series is the two snapshots only (no fake drop to 3 MiB and back), no leak is
    # claimed, and the report says what snapshots alone cannot show
    [series] = [s for s in report.series if s["kind"] == "snapshot"]
    assert [p["allocated"] for p in series["points"]] == [100 * MiB, 100 * MiB]
    assert _rules(report, "memory-leak") == []
    (gap,) = _rules(report, "coverage")
    assert gap.severity == "info" and "small-tensor leaks" in gap.summary
    assert any("torch tensors" in f for f in gap.fix)


def test_census_pairs_leave_no_coverage_note(tmp_path: Path) -> None:
    paths = [str(write_json(tmp_path / f"c{n}.json", census(5, 1.0 + n, [holder("m.x[*]", 3, 12)])))
             for n in range(2)]
    assert _rules(analyze(paths), "coverage") == []
    (one,) = _rules(analyze(paths[:1]), "coverage")
    assert "one census cannot show growth" in one.summary.lower()


def test_losses_whose_storage_is_batch_sized_are_still_losses(tmp_path: Path) -> None:
    # A LightningModule's `self.losses.append(loss)`: each 0-d F.mse_loss result keeps its
    # 196 KiB buffer (64 x 784 floats), so bytes per tensor said "model outputs" and the fix
    # said to run the model under no_grad; one element a tensor says losses: `.item()` first.
    paths = []
    for n, k in enumerate((1000, 1300, 1600)):
        row = holder("__main__.autoencoder.losses[*]", k, k * 200704, grad=k, graph=0)
        row["numel"] = k
        paths.append(str(write_json(tmp_path / f"s{n}.json", census(3, 1.0 + n, [row]))))
    (g,) = _rules(analyze(paths), "graph-retention")
    assert "loss.item()" in g.fix[0] and "inference_mode" not in g.fix[0]
    assert "196.0 KiB of storage" in g.fix[1] and "`.detach()` alone does not" in g.fix[1]
