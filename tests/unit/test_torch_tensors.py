"""torch tensors: the census finds leaks by holder path, measures retained graphs, diffs, and
keeps nothing alive. In-process: the handler runs in its own thread as in the agent."""

from __future__ import annotations

import gc
import io
import json
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import drop_workload, make_workload, run_handler  # noqa: E402

from flight_profiler.agent import census_diff  # noqa: E402
from flight_profiler.agent.registry import CommandError  # noqa: E402
from support import PYTHONS  # noqa: E402

CENSUS_KEYS = {"format", "version", "pid", "time", "label", "totals", "groups", "holders", "sites",
               "skipped", "elapsed_s", "census_id", "previous_id", "moment", "holders_complete"}
HOLDER_KEYS = {"path", "example", "kind", "count", "bytes", "numel", "with_grad_fn", "graph_bytes", "root"}
# Only where they apply: a local's frame depth, a capped container's limit and length, and what
# the holder still holds of the previous census (with a previous census of this process).
HOLDER_OPTIONAL = {"depth", "cap", "length", "kept", "sampled", "chained"}


@pytest.fixture
def work():
    module = make_workload()
    yield module
    drop_workload(module)
    gc.collect()


def census(tmp_path: Path, name: str = "c.json", **args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    path = tmp_path / name
    result, _ = run_handler("torch tensors", {"path": str(path), "top": 50, **args})
    return result, json.loads(path.read_text())


def holder(doc: dict[str, Any], path: str) -> dict[str, Any]:
    matches = [h for h in doc["holders"] if h["path"] == path]
    assert matches, f"{path} not among {[h['path'] for h in doc['holders']]}"
    return matches[0]


def test_leaked_losses_are_named_by_holder_path(work, tmp_path):
    for i in range(40):
        work.train_step(i)
    result, doc = census(tmp_path)
    assert set(doc) == CENSUS_KEYS
    assert doc["format"] == "flight_profiler.census" and doc["version"] == 1
    assert set(doc["totals"]) == {"count", "bytes", "with_grad_fn", "graph_bytes", "by_device"}
    assert set(doc["totals"]["by_device"]["cpu"]) == {"count", "bytes"}
    assert all(set(g) == {"device", "dtype", "shape", "count", "bytes", "with_grad_fn"} for g in doc["groups"])
    assert all(HOLDER_KEYS <= set(h) <= HOLDER_KEYS | HOLDER_OPTIONAL for h in doc["holders"])
    assert doc["previous_id"] is None and doc["moment"] == "at a safe point"
    assert set(doc["skipped"]) == {"objects", "reason"} and doc["sites"] == []
    h = holder(doc, "fp_torch_workload.losses[*]")
    assert h["count"] == 40 and h["with_grad_fn"] == 40 and h["kind"] == "list"
    assert h["example"].startswith("fp_torch_workload.losses[")
    assert h["bytes"] == 40 * 4 and h["numel"] == 40  # 40 float32 scalars
    # parameters are named by module attribute path, and optimizer-free SGD has no state
    assert holder(doc, "fp_torch_workload.model.0.weight")["kind"] == "parameter"
    assert result["path"] == str(tmp_path / "c.json") and result["size"] == (tmp_path / "c.json").stat().st_size


def test_retained_graphs_are_measured(work, tmp_path):
    for i in range(10):
        work.evaluate(i)
    _, doc = census(tmp_path)
    h = holder(doc, "fp_torch_workload.cache[*]")
    assert h["count"] == 10 and h["with_grad_fn"] == 10
    # each graph keeps its input (128x16) and ReLU output (128x64) alive: 40 KiB per output
    assert h["graph_bytes"] >= 10 * (128 * 16 + 128 * 64) * 4
    assert doc["totals"]["graph_bytes"] >= h["graph_bytes"]


def test_a_census_does_not_inflate_the_next_one(work, tmp_path):
    # GIVEN retained graphs whose saved tensors the census must read to measure them
    for i in range(10):
        work.evaluate(i)
    _, first = census(tmp_path, "a.json")
    # WHEN nothing changes in the program and a second census is taken
    _, second = census(tmp_path, "b.json")
    # THEN the tensor objects the first graph walk made are not counted as new tensors
    assert second["totals"]["count"] == first["totals"]["count"]
    assert second["totals"]["bytes"] == first["totals"]["bytes"]
    assert second["totals"]["graph_bytes"] == first["totals"]["graph_bytes"]


def test_views_share_storage_bytes(tmp_path):
    base = torch.zeros(1000)
    views = [base[i : i + 10] for i in range(50)]
    holder_module = type(sys)("fp_views")
    holder_module.base, holder_module.views = base, views
    sys.modules["fp_views"] = holder_module
    try:
        _, doc = census(tmp_path)
    finally:
        del sys.modules["fp_views"]
    group = next(g for g in doc["groups"] if g["shape"] == [1000])
    assert group["bytes"] == 4000
    views_group = next(g for g in doc["groups"] if g["shape"] == [10])
    assert views_group["count"] >= 50 and views_group["bytes"] == 0  # charged to the base once


def test_locals_of_running_functions_are_roots(tmp_path):
    ready, done = threading.Event(), threading.Event()

    def training_loop() -> None:
        running_losses = [torch.ones(3, requires_grad=True).sum() for _ in range(7)]
        ready.set()
        done.wait(30)
        del running_losses

    t = threading.Thread(target=training_loop, name="fp-loop")
    t.start()
    try:
        assert ready.wait(10)
        _, doc = census(tmp_path)
    finally:
        done.set()
        t.join()
    h = holder(doc, f"thread 'fp-loop' {__name__}.training_loop() local running_losses[*]")
    assert h["count"] == 7 and h["kind"] == "list" and h["with_grad_fn"] == 7


def test_diff_shows_what_grew(work, tmp_path):
    for i in range(5):
        work.train_step(i)
    _, first = census(tmp_path, "c1.json")
    for i in range(25):
        work.train_step(i)
        work.evaluate(i)
    result, second = census(tmp_path, "c2.json", previous=first)
    diff = result["diff"]
    grew = {h["path"]: h for h in diff["holders"]}
    assert grew["fp_torch_workload.losses[*]"]["count_delta"] == 25
    assert grew["fp_torch_workload.cache[*]"]["count_delta"] == 25
    assert grew["fp_torch_workload.cache[*]"]["graph_bytes_delta"] > 0
    assert diff["same_process"] is True
    assert diff["totals"]["count_delta"] >= 50
    # the pure function agrees with what the handler sent
    assert census_diff.diff(first, second)["totals"] == diff["totals"]


def test_nothing_is_kept_alive_and_gc_state_is_restored(work, tmp_path):
    t = torch.randn(256, 256)
    work.victim = t
    ref = weakref.ref(t)
    assert gc.isenabled()
    census(tmp_path)
    assert gc.isenabled()
    del work.victim, t
    assert ref() is None  # freed by refcount alone: the census holds no reference


def test_nothing_is_kept_alive_even_without_gc(tmp_path):
    """No reference cycle may hold what the census saw: with the cyclic GC off, a tensor held
    only by another thread's local must die as soon as that local is rebound."""
    ready, go, dropped = threading.Event(), threading.Event(), threading.Event()
    refs = []

    def step_loop() -> None:
        batch = torch.randn(128, 128)
        refs.append(weakref.ref(batch))
        ready.set()
        go.wait(30)
        batch = None
        dropped.set()

    t = threading.Thread(target=step_loop)
    gc.disable()
    try:
        t.start()
        assert ready.wait(10)
        _, doc = census(tmp_path)
        assert holder(doc, f"thread {__name__}.step_loop() local batch")["count"] == 1
        go.set()
        assert dropped.wait(10)
        assert refs[0]() is None
    finally:
        go.set()
        t.join()
        gc.enable()


def test_disabled_gc_stays_disabled(tmp_path):
    gc.disable()
    try:
        census(tmp_path)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_budget_exhaustion_is_reported(work, tmp_path):
    for i in range(3):
        work.train_step(i)
    _, doc = census(tmp_path, seconds=1e-6)
    assert doc["skipped"]["reason"], doc["skipped"]
    assert doc["elapsed_s"] < 5


def test_torch_missing_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "torch")
    with pytest.raises(CommandError) as info:
        run_handler("torch tensors", {"path": str(tmp_path / "x.json")})
    assert info.value.kind == "torch_missing"
    assert not (tmp_path / "x.json").exists()


def test_torch_still_being_imported_is_a_clear_error_and_status_says_so(monkeypatch, tmp_path):
    # the agent attached while the target's main thread is inside `import torch`: torch is in
    # sys.modules and has Tensor, but not yet profiler or cuda (seen: an AttributeError
    # "partially initialized module 'torch' has no attribute 'profiler'" as an internal error)
    import importlib.machinery
    import types

    from flight_profiler.agent.commands import status

    half = types.ModuleType("torch")
    half.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    half.__spec__._initializing = True  # what importlib sets while the module's code runs
    half.Tensor = type("Tensor", (), {})
    monkeypatch.setitem(sys.modules, "torch", half)
    with pytest.raises(CommandError) as info:
        run_handler("torch tensors", {"path": str(tmp_path / "x.json")})
    assert info.value.kind == "torch_missing" and "still importing torch" in str(info.value)
    assert status._torch_info() == {"imported": False, "importing": True, "version": None,
                                    "cuda_available": None}
    half.__spec__._initializing = False  # the import finished
    assert status._torch_info()["imported"] is True


def test_cli_diff_reads_only_census_json(tmp_path):
    from flight_profiler.errors import BadInputFile
    from flight_profiler.requests.torch import load_census

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(BadInputFile):
        load_census(str(bad))
    (tmp_path / "junk.json").write_bytes(b"\x80\x03pickle")
    # a pickle given by mistake is named as binary, not with the codec's byte offsets
    with pytest.raises(BadInputFile, match="binary file, not a census") as info:
        load_census(str(tmp_path / "junk.json"))
    assert "codec" not in str(info.value)


def test_renderer_shows_holders_and_growth(work, tmp_path):
    from rich.console import Console

    from flight_profiler.cli.agent_commands.torch import render_tensors

    work.train_step(0)
    _, first = census(tmp_path, "c1.json")
    for i in range(3):
        work.train_step(i)
    result, _ = census(tmp_path, "c2.json", previous=first)
    out = io.StringIO()
    render_tensors(result, Console(file=out, width=200))
    text = out.getvalue()
    assert "fp_torch_workload.losses[*]" in text and "what grew" in text and str(tmp_path) in text
    # the loss held at the first census is still held: a list that accumulates, not one rebuilt
    losses = next(h for h in result["holders"] if h["path"] == "fp_torch_workload.losses[*]")
    assert (losses["kept"], losses["sampled"]) == (1, 1) and "1 of 1 still held" in text


HOLDER_SCRIPT = r"""
import json, sys, threading, types, weakref
sys.path.insert(0, sys.argv[1])
from flight_profiler.agent import holder_paths

class Tensor:
    requires_grad = False
    is_leaf = True
    grad = None

torch = types.SimpleNamespace(Tensor=Tensor, nn=types.SimpleNamespace(Module=type("Module", (), {})))
mod = types.ModuleType("fp_holders"); sys.modules["fp_holders"] = mod
mod.losses = [Tensor() for _ in range(5)]
mod.trainer = types.SimpleNamespace(history={"loss": [Tensor()]})
ready, go, dropped, done = (threading.Event() for _ in range(4))
refs, out = [], {}

def loop():
    local_list = [Tensor() for _ in range(3)]
    refs.append(weakref.ref(local_list[0]))
    counter = 41
    ready.set(); go.wait(10)
    counter += 1
    out["after"] = [len(local_list), counter]   # the walk left this function's locals intact
    local_list = None   # only a stale f_locals snapshot could keep the old list alive now
    dropped.set(); done.wait(10)

t = threading.Thread(target=loop, name="fp-loop"); t.start(); ready.wait(10)
def census():  # as the agent does: from its own thread's frame, which is not walked
    import gc, time
    wanted = {id(o): o for o in gc.get_objects() if isinstance(o, Tensor)}
    w = holder_paths.walk(torch, wanted, 100000, 12, time.monotonic() + 10,
                          skip_thread=threading.get_ident())
    return sorted({w.path(i)[1] for i in wanted if w.path(i)})

paths = census()
go.set(); dropped.wait(10)
out["freed"] = refs[0]() is None
done.set(); t.join()
out["paths"] = paths
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_holder_walk_and_frame_locals_on_every_python(version, tmp_path):
    """Frame locals are read differently before 3.13 (a snapshot cached on the frame): the walk
    must find locals by name, leave the running function intact, and keep nothing alive."""
    script = tmp_path / "holders.py"
    script.write_text(HOLDER_SCRIPT)
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([PYTHONS[version], str(script), src], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"fp_holders.losses[*]", "fp_holders.trainer.history['loss'][*]",
            "thread 'fp-loop' loop() local local_list[*]"} <= set(out["paths"]), out
    assert out["after"] == [3, 42] and out["freed"] is True
