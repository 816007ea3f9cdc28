"""Censuses of real torch code written as users write it (state in a function's locals, the
census taken while the loop runs), judged by the real report: bounded growth is not a leak (an
LBFGS history attached early, a deque(maxlen) cache), a list that lives inside a running
forward() is not retention, and a hidden state carried without detach is found and named by the
loop's own variable whatever the moment the census stopped the thread.

In-process: the handler runs in its own thread, as in the agent; this thread plays the target.
"""

from __future__ import annotations

import collections
import gc
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler, spec  # noqa: E402

from flight_profiler.report import analyze  # noqa: E402

SEVERE = ("warning", "critical")
HERE = __name__


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    gc.collect()


class Censuses:
    """Censuses of this process in a row, each compared with the one before (as diagnose does)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.paths: list[str] = []
        self.docs: list[dict[str, Any]] = []

    def take(self, drive: Callable[[], None] | None = None, **args: Any) -> dict[str, Any]:
        path = self.tmp_path / f"c{len(self.paths)}.json"
        if self.docs:
            args["previous"] = {k: self.docs[-1].get(k) for k in ("pid", "time", "label", "totals", "groups",
                                                                   "holders", "census_id")}
        # A generous budget: this machine is shared, and the test process holds pytest too.
        run_handler("torch tensors", {"path": str(path), "top": 50, "seconds": 60.0, **args}, drive,
                    timeout=180)
        self.paths.append(str(path))
        self.docs.append(json.loads(path.read_text()))
        return self.docs[-1]

    def severe(self, rule: str) -> list[Any]:
        report = analyze(self.paths, jobs=1)
        return [f for f in report.findings if f.rule == rule and f.severity in SEVERE]


def holder(doc: dict[str, Any], end: str) -> dict[str, Any]:
    found = [h for h in doc["holders"] if h["path"].endswith(end)]
    assert found, (end, [h["path"] for h in doc["holders"]], doc["skipped"])
    return found[0]


def lbfgs_attached_early(c: Censuses) -> None:
    # A regression fitted with LBFGS and a closure, as in the PyTorch docs; the census starts
    # while the optimizer's history (history_size=20, 1 MiB an entry per list) still fills up.
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.05, max_iter=2, history_size=20)

    def closure() -> Any:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for steps in (2, 3, 6):
        for _ in range(steps):
            optimizer.step(closure)
        c.take()


def test_an_lbfgs_history_filling_up_is_not_a_leak(tmp_path: Path) -> None:
    c = Censuses(tmp_path)
    lbfgs_attached_early(c)
    # THEN growth toward a known cap is no leak
    assert c.severe("memory-leak") == [], [f.title for f in c.severe("memory-leak")]
    # AND the census saw it grow, and knew the history's cap
    dirs = [holder(d, "['old_dirs'][*]") for d in c.docs]
    assert dirs[0]["count"] < dirs[1]["count"] <= 20
    assert all(h["cap"] == 20 for h in dirs), dirs


def embeddings_kept_in_a_deque(c: Censuses) -> None:
    # An inference helper keeping the last 64 embeddings (1 MiB each) in a deque(maxlen=64).
    # (No assert in here: pytest's rewritten asserts call locals(), and a census does not read
    # the frame of a function that does.)
    model = torch.nn.Linear(256, 1024)
    recent: collections.deque[Any] = collections.deque(maxlen=64)
    for n in (10, 20, 30):
        for _ in range(n):
            with torch.no_grad():
                recent.append(model(torch.randn(256, 256)))
        c.take()


def test_a_deque_cache_filling_up_is_not_a_leak(tmp_path: Path) -> None:
    c = Censuses(tmp_path)
    embeddings_kept_in_a_deque(c)
    assert c.severe("memory-leak") == []
    h = holder(c.docs[-1], "embeddings_kept_in_a_deque() local recent[*]")
    assert h["cap"] == 64 and h["length"] == 60


class Sequence(torch.nn.Module):
    """Steps through time appending each output to a list, as the time-sequence example does."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(1, 16)
        self.linear = torch.nn.Linear(16, 1)
        # Test machinery: the timestep at which forward waits for a census to look at it.
        self.pause_at: int | None = None
        self.reached = threading.Event()
        self.release = threading.Event()

    def forward(self, input: Any) -> Any:
        outputs = []
        h = torch.zeros(input.size(0), 16)
        c = torch.zeros(input.size(0), 16)
        for t, input_t in enumerate(input.split(1, dim=1)):
            h, c = self.cell(input_t, (h, c))
            output = self.linear(h)
            outputs += [output]
            if t == self.pause_at:
                self.reached.set()
                self.release.wait(60)
        return torch.cat(outputs, dim=1)


def test_a_list_that_lives_inside_a_running_forward_is_not_retention(tmp_path: Path) -> None:
    c = Censuses(tmp_path)
    seq = Sequence()
    x = torch.randn(4, 150)

    def step() -> None:
        seq(x).pow(2).mean().backward()

    for pause_at in (59, 99, 139):
        for _ in range(2):
            step()  # whole calls between two censuses: a new list each time
        # The census stops forward at this timestep (its list that long), in a training thread
        seq.pause_at = pause_at
        seq.reached.clear()
        seq.release.clear()
        trainer = threading.Thread(target=step, name="trainer")
        trainer.start()
        seq.reached.wait(60)
        try:
            c.take()
        finally:
            seq.release.set()
            trainer.join(60)
        seq.pause_at = None
    counts = [holder(d, "forward() local outputs[*]")["with_grad_fn"] for d in c.docs]
    assert counts == [59, 99, 139]  # the newest output is `local output` too, named by that
    # THEN a list rebuilt at every call is neither retention nor a leak, however it grew
    assert c.severe("graph-retention") == [] and c.severe("memory-leak") == []


class RNNModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(8, 16)
        self.rnn = torch.nn.LSTM(16, 16)
        self.decoder = torch.nn.Linear(16, 8)

    def forward(self, input: Any, hidden: Any) -> Any:
        output, hidden = self.rnn(self.encoder(input), hidden)
        time.sleep(0.002)  # the census mostly stops the thread in here, holding the new state
        return self.decoder(output), hidden


def rnn_without_repackage(c: Censuses, after_forward: bool) -> None:
    # The classic mistake: the hidden state is carried from batch to batch undetached, and
    # backward(retain_graph=True) silences the error that follows.
    # The update is written on p.data, as pytorch/examples' word language model does (an
    # optimizer's in-place step would make the retained graph's backward fail).
    torch.manual_seed(0)
    model = RNNModel()
    hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
    data = torch.randn(10, 4, 8)

    def train_batch() -> None:
        nonlocal hidden
        model.zero_grad()
        output, hidden = model(data, hidden)
        output.pow(2).mean().backward(retain_graph=True)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.01)

    target = {"target": spec(HERE, "forward", "RNNModel")} if after_forward else {}
    for _ in range(3):
        for _ in range(4):
            train_batch()
        c.take(drive=train_batch, **target)


@pytest.mark.parametrize("after_forward", [False, True], ids=["any-moment", "after-forward"])
def test_a_hidden_state_carried_undetached_is_named_by_the_loop(tmp_path: Path, after_forward: bool) -> None:
    c = Censuses(tmp_path)
    rnn_without_repackage(c, after_forward)
    loop = f"{HERE}.rnn_without_repackage() local hidden[*]"
    # THEN each census after the first proved the loop's hidden reaches the graph it held before
    assert [holder(d, loop).get("chained") for d in c.docs[1:]] == [True, True]
    (chain,) = c.severe("graph-chain")
    assert chain.metrics["holder"] == loop and chain.severity == "critical"
    assert "repackage_hidden(hidden)" in chain.fix[0]
    if after_forward:
        assert all(d["moment"] == f"right after {HERE}.RNNModel.forward returned" for d in c.docs)
        paths = {h["path"] for d in c.docs for h in d["holders"]}
        assert not [p for p in paths if "forward() local" in p], paths
        assert any(p.startswith("RNNModel.forward() return") or p.startswith(f"{HERE}.RNNModel.forward() return")
                   for p in paths), paths


def test_a_repackaged_hidden_state_is_not_chained(tmp_path: Path) -> None:
    c = Censuses(tmp_path)
    model = RNNModel()
    hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
    data = torch.randn(10, 4, 8)

    def train_batch() -> None:
        nonlocal hidden
        hidden = tuple(h.detach() for h in hidden)  # repackage_hidden
        output, hidden = model(data, hidden)
        output.pow(2).mean().backward()

    for _ in range(3):
        for _ in range(4):
            train_batch()
        c.take(drive=train_batch, target=spec(HERE, "forward", "RNNModel"))
    # THEN the census looked, and the hidden state forward returns is a fresh graph each time
    returned = [holder(d, "RNNModel.forward() return[*][*]") for d in c.docs[1:]]
    assert [h.get("chained") for h in returned] == [False, False], returned
    assert c.severe("graph-chain") == []


@pytest.mark.parametrize("loop_began_first", [True, False])
def test_grads_on_forward_finds_the_hidden_state_it_returns_second(tmp_path: Path, loop_began_first: bool) -> None:
    # GIVEN forward returns (output, (h, c)) and the loop keeps (h, c) undetached; the measuring
    # begins either mid-loop or before the loop's first call (hidden still the initial zeros)
    model = RNNModel()
    state: dict[str, Any] = {"hidden": (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))}
    data = torch.randn(10, 4, 8)
    plain_code = RNNModel.forward.__code__

    def train_batch() -> None:
        if not loop_began_first and not state.get("hooked") and RNNModel.forward.__code__ is not plain_code:
            state["hooked"] = True
            state["hidden"] = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
        hidden = state["hidden"]
        output, hidden = model(data, hidden)
        output.pow(2).mean().backward(retain_graph=True)
        state["hidden"] = hidden

    path = tmp_path / "g.json"
    run_handler("torch grads", {"target": spec(HERE, "forward", "RNNModel"), "calls": 4, "timeout": 30,
                                "path": str(path)}, train_batch)
    doc = json.loads(path.read_text())
    last = doc["measurements"][-1]["carried"]
    # THEN the second returned value's tensors, and the loop's own local, are checked
    assert last["return[1][0]"]["chained"] is True and last["return[1][1]"]["chained"] is True
    assert last[f"{HERE}.train_batch() local hidden[0]"]["from"] == "return[1][0]"
    report = analyze([str(path)], jobs=1)
    (chain,) = [f for f in report.findings if f.rule == "graph-chain"]
    assert chain.metrics["holder"] == f"{HERE}.train_batch() local hidden"
    assert "repackage_hidden(hidden)" in chain.fix[0]
