"""Holders are named wherever users keep their data: a function's locals (main() or a server
thread's frame), closures, caches keyed per request; and tensor walks work while the torch work
runs in a worker thread and the main thread is parked."""

from __future__ import annotations

import ctypes
import gc
import json
import pprint
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler  # noqa: E402

from flight_profiler.agent.registry import CommandError  # noqa: E402


def census(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "c.json"
    run_handler("torch tensors", {"path": str(path), "top": 50})
    return json.loads(path.read_text())


def paths(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["path"]: h for h in doc["holders"]}


class Trainer:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(4, 1)
        self.history: list[Any] = []

    def step(self) -> None:
        loss = self.model(torch.randn(8, 4)).pow(2).mean()
        self.history.append(loss)  # the user's leak: the loss keeps its graph


def main(tmp_path: Path) -> dict[str, Any]:
    # A Trainer created inside the function the main thread runs (not a global). No assert
    # here: pytest rewrites asserts into locals() calls, and the walk (rightly) leaves the
    # locals of a function that calls locals() alone before Python 3.13.
    trainer = Trainer()
    for _ in range(6):
        trainer.step()
    doc = census(tmp_path)  # while this (main) thread waits for it
    del trainer
    return doc


def test_holder_in_a_functions_locals_in_the_main_thread(tmp_path):
    # Tensors that earlier tests of this process left alive only from C++ (a graph's saved
    # tensors: no Python holder) are rightly <unreached>; this test's own must all be reached.
    gc.collect()
    before = paths(census(tmp_path)).get("<unreached>", {}).get("count", 0)
    doc = main(tmp_path)
    # THEN the holder is named from main()'s local, folded over the list's indices
    h = paths(doc)[f"{__name__}.main() local trainer.history[*]"]
    assert h["count"] == 6 and h["with_grad_fn"] == 6
    assert paths(doc)[f"{__name__}.main() local trainer.model.weight"]["count"] == 1
    assert paths(doc).get("<unreached>", {}).get("count", 0) <= before


def test_closures_and_per_request_caches_fold_into_one_holder(tmp_path):
    module = types.ModuleType("fp_roots_mod")
    module.__file__ = "/nonexistent/fp_roots_mod.py"

    def make_hook() -> Any:
        seen: list[Any] = []

        def hook(x: Any) -> None:
            seen.append(x)
        return hook

    module.hook = make_hook()
    module._RESULT_CACHE = {}
    for i in range(20):
        module.hook(torch.ones(2, requires_grad=True) * 2)
        module._RESULT_CACHE[f"req-{880 + i}"] = torch.ones(3, requires_grad=True) * 3
    import sys
    sys.modules[module.__name__] = module
    try:
        doc = census(tmp_path)
    finally:
        sys.modules.pop(module.__name__, None)
        module.__dict__.clear()
        gc.collect()
    found = paths(doc)
    assert found["fp_roots_mod.hook.<closure seen>[*]"]["count"] == 20
    # One holder for the cache, not one per request key
    assert found["fp_roots_mod._RESULT_CACHE[*]"]["count"] == 20
    assert not [p for p in found if "req-" in p]


def test_census_while_the_main_thread_is_parked_and_a_worker_does_torch_work(tmp_path):
    # GIVEN an inference server: a worker thread runs the model and caches outputs WITH grad in
    # its own locals; the main thread (this one) only waits
    stop = threading.Event()
    model = torch.nn.Linear(64, 64)

    def serve_forever() -> None:
        cache: dict[str, Any] = {}
        n = 0
        while not stop.is_set():
            x = torch.randn(32, 64)
            cache[f"req-{n % 40}"] = model(x).relu()
            n += 1

    server = threading.Thread(target=serve_forever, name="server")
    server.start()
    try:
        time.sleep(0.2)
        # WHEN a census runs (the main thread waits in run_handler's loop meanwhile)
        started = time.monotonic()
        doc = census(tmp_path)
        took = time.monotonic() - started
    finally:
        stop.set()
        server.join(10)
    # THEN it worked (no "retry while training"), quickly, and names the worker's local
    h = paths(doc)[f"thread 'server' {__name__}.serve_forever() local cache[*]"]
    assert 1 <= h["count"] <= 40 and h["with_grad_fn"] == h["count"]
    assert took < 30


def test_a_thread_stuck_in_one_native_call_fails_fast_and_says_why(tmp_path):
    # GIVEN a thread inside one long native call that is not a known wait (3 s in usleep)
    libc = ctypes.CDLL(None)
    entered = threading.Event()

    def long_native_op() -> None:
        entered.set()
        libc.usleep(3_000_000)

    t = threading.Thread(target=long_native_op, name="busy-op")
    t.start()
    entered.wait(5)
    time.sleep(0.05)
    try:
        started = time.monotonic()
        with pytest.raises(CommandError) as err:
            run_handler("torch tensors", {"path": str(tmp_path / "c.json")})
        took = time.monotonic() - started
    finally:
        t.join()
    # THEN it gave up within the 2 s budget (generous bound for a loaded machine), named the
    # thread and where it is, and wrote nothing
    assert took < 2.9
    assert "busy-op" in err.value.message and "long_native_op()" in err.value.message
    assert not (tmp_path / "c.json").exists()


def loop_with_censuses(tmp_path: Path) -> list[set[str]]:
    # The main thread keeps training while each census is taken: it is held wherever it is
    # (often inside Trainer.step, where `self` is the trainer too). No assert here (see main()).
    trainer = Trainer()
    for _ in range(3):
        trainer.step()
    seen = []
    for n in range(3):
        path = tmp_path / f"c{n}.json"
        run_handler("torch tensors", {"path": str(path), "top": 50}, drive=trainer.step)
        seen.append({h["path"] for h in json.loads(path.read_text())["holders"]})
    del trainer
    return seen


def test_the_holder_path_is_the_same_wherever_the_thread_was_held(tmp_path):
    seen = loop_with_censuses(tmp_path)
    # THEN every census names the outermost user frame's local, never `step() local self`
    want = f"{__name__}.loop_with_censuses() local trainer.history[*]"
    assert all(want in paths for paths in seen), seen
    assert not [p for paths in seen for p in paths if "step() local self" in p]


class _WaitsForTheCensus:
    """Its repr returns once the census thread has ended: pprint stays on the stack meanwhile."""

    def __repr__(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                t.name == "fp-test-agent" for t in threading.enumerate()):
            time.sleep(0.005)
        return "_WaitsForTheCensus()"


def census_while_a_library_frame_holds_a_weight(tmp_path: Path) -> dict[str, Any]:
    trainer = Trainer()
    trainer.step()
    path = tmp_path / "c.json"

    def drive() -> None:  # pprint's frames hold the list: one edge from the weight, not two
        pprint.pformat([trainer.model.weight, _WaitsForTheCensus()])

    run_handler("torch tensors", {"path": str(path), "top": 50}, drive=drive)
    return dict(json.loads(path.read_text()))


def test_a_libraries_local_never_names_what_the_program_holds(tmp_path):
    # GIVEN a weight that a stdlib function's local reaches in fewer edges than main()'s trainer
    doc = census_while_a_library_frame_holds_a_weight(tmp_path)
    # THEN it is named from the program's own function, as it would be a moment later
    want = f"{__name__}.census_while_a_library_frame_holds_a_weight() local trainer.model.weight"
    assert want in paths(doc), sorted(paths(doc))
    assert not [p for p in paths(doc) if "pprint" in p], sorted(paths(doc))


def test_the_walk_ends_once_the_program_named_everything_and_goes_on_for_what_it_did_not():
    # The libraries' globals (torch's ~1,000 modules) were most of every census's walk, 0.5 s of
    # a character RNN's 0.7 s, walked even when the program's own roots had named every tensor.
    import sys

    from flight_profiler.agent import holder_paths

    program = types.ModuleType("fp_test_program")
    program.__file__ = "/srv/job/fp_test_program.py"
    program.weights = [torch.ones(3), torch.ones(4)]  # type: ignore[attr-defined]
    hidden_in_a_library = torch.ones(5)
    sys.modules[program.__name__] = program
    try:
        named = {id(t): t for t in program.weights}  # type: ignore[attr-defined]
        w = holder_paths.walk(torch, named, 2_000_000, 12, time.monotonic() + 30)
        assert {w.path(i)[0] for i in named} == {"fp_test_program.weights[0]", "fp_test_program.weights[1]"}
        # an object nothing holds keeps the walk going through every library's globals
        nowhere = torch.ones(2)
        full = holder_paths.walk(torch, {**named, id(nowhere): nowhere}, 2_000_000, 12,
                                 time.monotonic() + 30)
        assert full.path(id(nowhere)) is None and not w.truncated
        assert w.visited * 2 < full.visited, (w.visited, full.visited)  # no library was walked
        json._fp_test_cache = hidden_in_a_library  # type: ignore[attr-defined]
        both = {**named, id(hidden_in_a_library): hidden_in_a_library}
        w = holder_paths.walk(torch, both, 2_000_000, 12, time.monotonic() + 30)
        assert w.path(id(hidden_in_a_library))[0] == "json._fp_test_cache"
    finally:
        del sys.modules[program.__name__]
        json.__dict__.pop("_fp_test_cache", None)
