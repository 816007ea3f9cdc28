"""Bounded growth is not a leak, and a carried graph is found by what the census proved
(report/census_growth.py, memory-leak, graph-retention and graph-chain over census series).

The censuses here carry what the agent writes since issue 18: the holder's root (global, a
running function's local with its frame depth, the method's return value), the cap of a capped
container, what it still holds of the previous census (kept of sampled) and whether its graph
reaches the one it held then (chained)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from report_synth import census, holder, snapshot, write_json, write_pickle

from flight_profiler.report import Report, analyze

MiB = 1 << 20
SEVERE = ("warning", "critical")


def _rules(report: Report, rule: str, severe: bool = True) -> list:  # type: ignore[type-arg]
    return [f for f in report.findings if f.rule == rule and (not severe or f.severity in SEVERE)]


def _series(tmp_path: Path, rows: list[list[dict[str, Any]]], tracked: bool = True) -> list[str]:
    """One census per entry of ``rows``; ``tracked``: written by an agent that says what each
    holder still holds of the previous census (census_id / previous_id)."""
    paths = []
    for k, holders in enumerate(rows):
        c = census(9, 100.0 + 5 * k, holders, label=f"c{k}")
        if tracked:
            c["census_id"] = f"id{k}"
            c["previous_id"] = f"id{k - 1}" if k else None
        paths.append(str(write_json(tmp_path / f"c{k}.json", c)))
    return paths


def row(path: str, count: int, nbytes: int, grad: int = 0, graph: int = 0, kind: str = "list",
        **extra: Any) -> dict[str, Any]:
    return {**holder(path, count, nbytes, grad=grad, graph=graph, kind=kind), **extra}


def test_an_lbfgs_history_filling_up_to_its_cap_is_not_a_leak(tmp_path: Path) -> None:
    # GIVEN LBFGS attached early: old_dirs fills towards history_size=100, 4 MiB an entry
    path = "__main__.optimizer.state[*]['old_dirs'][*]"
    rows = [[row(path, n, n * 4 * MiB, kind="list", root="global", cap=100, length=n,
                 **({"kept": 8, "sampled": 8} if k else {}))]
            for k, n in enumerate((12, 40, 76))]
    report = analyze(_series(tmp_path, rows))
    # THEN no leak: the history is capped, and the report says why it did not count it
    assert _rules(report, "memory-leak", severe=False) == []
    # AND the same growth in an uncapped list is one
    rows = [[{k2: v for k2, v in r.items() if k2 not in ("cap", "length")} for r in census_rows]
            for census_rows in rows]
    (leak,) = _rules(analyze(_series(tmp_path, rows)), "memory-leak")
    assert leak.severity == "critical" and leak.metrics["growing_holders"] == [path]


def test_a_list_whose_length_stops_growing_is_not_a_leak(tmp_path: Path) -> None:
    rows = [[row("__main__.recent[*]", n, n * MiB, root="global", **({"kept": 8, "sampled": 8} if k else {}))]
            for k, n in enumerate((10, 60, 60))]
    report = analyze(_series(tmp_path, rows))
    assert _rules(report, "memory-leak", severe=False) == []


def test_growth_between_two_censuses_is_only_an_info(tmp_path: Path) -> None:
    rows = [[row("__main__.losses[*]", n, n * MiB, grad=n, graph=n * MiB, root="global",
                 **({"kept": 8, "sampled": 8} if k else {}))] for k, n in enumerate((10, 80))]
    report = analyze(_series(tmp_path, rows))
    assert _rules(report, "memory-leak") == [] and _rules(report, "graph-retention") == []
    (leak,) = _rules(report, "memory-leak", severe=False)
    assert leak.severity == "info" and "a third" in leak.title
    (kept,) = _rules(report, "graph-retention", severe=False)
    assert kept.severity == "info"


def test_two_snapshots_that_grew_are_only_an_info(tmp_path: Path) -> None:
    paths = [str(write_pickle(tmp_path / f"s{k}.pickle", snapshot(
        allocated=[(50 * MiB, "train.py", 42)] * (k + 1),
        fp={"device_type": "cpu", "pid": 3, "time": 10.0 + k, "label": f"s{k}"}))) for k in range(2)]
    (f,) = _rules(analyze(paths), "memory-leak", severe=False)
    assert f.severity == "info" and "third snapshot" in f.fix[0]


def _forward_local(tmp_path: Path, kept: int) -> list[str]:
    # A census that caught the step inside Sequence.forward three times, its per-timestep
    # `outputs` list longer each time; what it held at one census is gone at the next (kept=0)
    path = "Sequence.forward() local outputs[*]"
    rows = [[row(path, n, n * 8 * 1024, grad=n, graph=n * 64 * 1024, root="local", depth=3,
                 **({"kept": kept, "sampled": 8} if k else {}))]
            for k, n in enumerate((120, 480, 950))]
    return _series(tmp_path, rows)


def test_a_list_rebuilt_inside_a_running_forward_is_not_graph_retention(tmp_path: Path) -> None:
    report = analyze(_forward_local(tmp_path, kept=0))
    assert _rules(report, "graph-retention") == [] and _rules(report, "memory-leak") == []
    # the same holder seen to survive (its first entries still there) is a leak
    report = analyze(_forward_local(tmp_path, kept=8))
    (g,) = _rules(report, "graph-retention")
    assert g.metrics["holder"] == "Sequence.forward() local outputs[*]"


def test_one_census_of_a_running_functions_list_is_not_called_retention(tmp_path: Path) -> None:
    c = census(9, 1.0, [row("Sequence.forward() local outputs[*]", 900, 900 * 8, grad=900,
                            graph=40 * MiB, root="local", depth=3)])
    c["census_id"] = "id0"
    report = analyze([str(write_json(tmp_path / "c.json", c))])
    assert _rules(report, "graph-retention") == []
    # a module global holding as many is still the usual shape of the bug
    c["holders"][0] = row("__main__.outputs[*]", 900, 900 * 8, grad=900, graph=40 * MiB, root="global")
    (g,) = _rules(analyze([str(write_json(tmp_path / "g.json", c))]), "graph-retention")
    assert g.severity == "warning"


def _rnn_series(tmp_path: Path, forward_chained: bool, loop_links: tuple[bool, bool]) -> list[str]:
    # The classic RNN mistake, censuses taken at different moments: the graph bytes went to
    # whichever local the walk met first (the loop's `hidden` at one census, forward's at the
    # next), but at each census the loop's `hidden` reached the graph it held at the previous one
    rows = []
    for k, (loop_graph, fwd_graph) in enumerate(((80 * MiB, 0), (2 * MiB, 95 * MiB), (110 * MiB, 0))):
        census_rows = [row("train() local hidden[*]", 2, 16384, grad=2, graph=loop_graph, kind="tuple",
                           root="local", depth=2,
                           **({"kept": 0, "sampled": 2, "chained": loop_links[k - 1]} if k else {})),
                       row("train() local output", 1, 2560000, grad=1, graph=163840, kind="local",
                           root="local", depth=2, **({"kept": 0, "sampled": 1, "chained": False} if k else {})),
                       row("RNNModel.forward() local hidden[*]", 2, 16384, grad=2, graph=fwd_graph,
                           kind="tuple", root="local", depth=5,
                           **({"kept": 0, "sampled": 2, "chained": forward_chained} if k else {}))]
        rows.append(census_rows)
    return _series(tmp_path, rows)


def test_a_carried_hidden_state_is_found_by_its_chain_and_named_by_the_loop(tmp_path: Path) -> None:
    report = analyze(_rnn_series(tmp_path, forward_chained=True, loop_links=(True, True)))
    (chain,) = _rules(report, "graph-chain")
    assert chain.metrics["holder"] == "train() local hidden[*]"  # the loop's, not forward's
    assert chain.severity == "critical" and chain.metrics["chained"] == [True, True]
    assert "repackage_hidden" in chain.fix[0] and "hidden.detach()" in chain.fix[0]
    assert _rules(report, "graph-retention") == []


def test_a_graph_that_is_not_chained_is_no_graph_chain_whatever_its_bytes(tmp_path: Path) -> None:
    # The loop's `hidden` graph bytes grow, but at one census it did not reach the graph it held
    # at the previous one: a fresh graph each step (repackaged), not a chain
    paths = _series(tmp_path, [[row("train() local hidden[*]", 2, 16384, grad=2, graph=g, kind="tuple",
                                    root="global", **extra)]
                               for g, extra in ((2 * MiB, {}), (4 * MiB, {"kept": 0, "sampled": 2, "chained": True}),
                                                (7 * MiB, {"kept": 0, "sampled": 2, "chained": False}))])
    assert _rules(analyze(paths), "graph-chain") == []


def test_a_running_sum_of_losses_is_told_to_keep_numbers(tmp_path: Path) -> None:
    paths = _series(tmp_path, [[row("train_one_epoch() local running_loss", 1, 4, grad=1, graph=g,
                                    kind="local", root="local", depth=2,
                                    **({"kept": 0, "sampled": 1, "chained": True} if k else {}))]
                               for k, g in enumerate((4096, 4096, 8192))])
    (chain,) = _rules(analyze(paths), "graph-chain")
    assert chain.metrics["holder"] == "train_one_epoch() local running_loss"
    assert "running_loss += loss.item()" in chain.fix[0]


def _grads_doc(carried: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": "flight_profiler.grads", "version": 1, "pid": 1, "time": 0.0, "mode": "method",
            "target": "__main__.RNNModel.forward",
            "models": [{"name": "__main__.model", "class": "RNNModel", "params": 1, "numel": 4,
                        "layers": [{"name": "w"}]}],
            "measurements": [{"models": [{"grad_norm": 1.0, "layers": [[1.0, 1.0, 0, 0, 1.0]],
                                          "weight_norms": [1.0]}], "carried": c} for c in carried],
            "optimizers": [], "zeroing": {"observed": False}}


def test_the_calls_name_the_loops_local_that_receives_the_returned_hidden_state(tmp_path: Path) -> None:
    # GIVEN forward returns (output, (h, c)) and the loop keeps (h, c) in `hidden` undetached
    def call(k: int) -> dict[str, Any]:
        link = None if k == 0 else True
        out = {"return[0]": {"chained": None if k == 0 else False, "walked": 40, "scalar": False}}
        for i in range(2):
            out[f"return[1][{i}]"] = {"chained": link, "walked": 30, "scalar": False}
            out[f"train() local hidden[{i}]"] = {"chained": link, "walked": 30, "scalar": False,
                                                 **({"from": f"return[1][{i}]"} if k else {})}
        return out

    path = tmp_path / "g.json"
    path.write_text(json.dumps(_grads_doc([call(k) for k in range(4)])))
    report = analyze([str(path)])
    # THEN one finding, named by the loop's local (the variable to edit), fixed by repackage_hidden
    (chain,) = _rules(report, "graph-chain")
    assert chain.metrics["holder"] == "train() local hidden"
    assert "__main__.RNNModel.forward" in chain.where[0]
    assert "repackage_hidden(hidden)" in chain.fix[0]


def test_unreached_tensors_of_a_census_cut_short_are_not_called_a_leak(tmp_path: Path) -> None:
    # GIVEN censuses whose holder walk stopped at its time budget (a loaded machine): an LBFGS
    # history it did not reach shows up as <unreached>, growing
    rows = [[row("<unreached>", n, n * MiB, kind="unknown", root="unreached",
                 **({"kept": 8, "sampled": 8} if k else {}))] for k, n in enumerate((11, 38, 45))]
    paths = _series(tmp_path, rows)
    for p in paths:
        doc = json.loads(Path(p).read_text())
        doc["holders_complete"] = False
        Path(p).write_text(json.dumps(doc))
    report = analyze(paths)
    # THEN no leak is claimed on tensors nobody could name
    assert _rules(report, "memory-leak") == []


def test_a_running_sum_reset_each_epoch_is_a_chain_that_restarted(tmp_path: Path) -> None:
    # pytorch/examples' `train_loss += loss` (no .item()), `train_loss = 0` at each epoch: one
    # census interval spans the reset (its new chain does not reach the old one), the last one
    # proves the chain; backward() freed every saved tensor, so the graph holds no bytes.
    paths = _series(tmp_path, [[row("train() local train_loss", 1, 4, grad=1, graph=0, kind="local",
                                    root="local", depth=1, **extra)]
                               for extra in ({}, {"kept": 0, "sampled": 1, "chained": False},
                                             {"kept": 1, "sampled": 1, "chained": True})])
    (chain,) = _rules(analyze(paths), "graph-chain")
    assert chain.severity == "warning" and chain.metrics["chained"] == [False, True]
    assert "train_loss += loss.item()" in chain.fix[0]
    assert "restarted" in chain.summary and "no saved tensors" in chain.summary, chain.summary
    # the reset in the last interval: the same number, the same mistake
    paths = _series(tmp_path, [[row("train() local train_loss", 1, 4, grad=1, graph=0, kind="local",
                                    root="local", depth=1, **extra)]
                               for extra in ({}, {"kept": 1, "sampled": 1, "chained": True},
                                             {"kept": 0, "sampled": 1, "chained": False})])
    (chain,) = _rules(analyze(paths), "graph-chain")
    assert chain.metrics["chained"] == [True, False]
    # losses summed over micro-batches for one backward() every K (gradient accumulation): the
    # sum holds its saved activations; a chain that restarts at each backward is no mistake
    paths = _series(tmp_path, [[row("train() local acc_loss", 1, 4, grad=1, graph=g, kind="local",
                                    root="local", depth=1, **extra)]
                               for g, extra in ((MiB, {}), (2 * MiB, {"kept": 1, "sampled": 1, "chained": True}),
                                                (MiB, {"kept": 0, "sampled": 1, "chained": False}))])
    assert _rules(analyze(paths), "graph-chain") == []
