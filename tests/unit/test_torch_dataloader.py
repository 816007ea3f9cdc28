"""torch dataloader: a DataLoader with workers too slow for the loop is found with its real
settings, its workers (pid, state, RSS), and the loop's time waiting on it."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import run_handler  # noqa: E402

from flight_profiler.agent import dataloader_state  # noqa: E402


class SlowDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.02)  # decoding/augmentation slower than the step
        return torch.full((8,), float(i))


def test_slow_loader_is_described_and_the_wait_measured() -> None:
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)

    def train_step() -> None:  # the main thread: take a batch, a tiny step
        batch = next(it)
        batch.sum()

    result, _ = run_handler("torch dataloader", {"sample": 1.0}, drive=train_step)
    [dl] = [d for d in result["loaders"] if d["dataset"]["type"].endswith("SlowDataset")]
    assert (dl["batch_size"], dl["num_workers"], dl["pin_memory"], dl["prefetch_factor"],
            dl["persistent_workers"]) == (4, 2, False, 2, False)
    assert dl["dataset"]["length"] == 10_000
    [its] = dl["iterators"]
    # counters are read at the end of the window, with the loop's rate over it
    assert its["batches_yielded"] >= 2 and its["batches_in_flight"] >= 1
    assert its["batches_in_window"] >= 1
    assert its["batches_yielded"] - its["batches_in_window"] >= 1  # the one taken before
    assert its["batches_per_s"] == pytest.approx(its["batches_in_window"] / result["sampled_s"], rel=0.1)
    assert len(its["workers"]) == 2
    for w in its["workers"]:
        assert w["pid"] != os.getpid() and w["state"] in ("running", "sleeping")
        assert w["rss_bytes"] > 1_000_000
    main = next(t for t in result["threads"] if t["thread"] == "MainThread")
    # The main thread's time goes to waiting for worker batches, and the call site is named
    assert main["shares"].get("dataloader_wait", 0) > 0.5
    assert "train_step()" in main["top"][0]["where"]


def test_no_loader_says_so() -> None:
    result, _ = run_handler("torch dataloader", {"sample": 0})
    assert result["loaders"] == [] and "no DataLoader" in result["note"]


def test_classify_a_sleep_and_a_plain_loop() -> None:
    import sys
    import threading

    ready = threading.Event()

    def napper() -> None:
        ready.set()
        time.sleep(1.0)

    t = threading.Thread(target=napper)
    t.start()
    ready.wait()
    time.sleep(0.05)
    frame = sys._current_frames()[t.ident]  # type: ignore[index]
    category, where = dataloader_state.classify(frame)
    del frame
    t.join()
    assert category == "sleep" and "napper()" in where
    assert dataloader_state.classify(sys._getframe())[0] == "running"


def test_cli_parses_and_renders() -> None:
    import io

    from rich.console import Console

    from flight_profiler.cli.agent_commands import rendering
    from flight_profiler.requests import parse

    request = parse("torch dataloader --sample 0.5")
    shown = rendering(request.cmd)
    assert request.cmd == "torch dataloader" and request.args == {"sample": 0.5}
    data = {"loaders": [{"type": "DataLoader", "dataset": {"type": "m.DS", "length": 9}, "batch_size": 4,
                         "num_workers": 2, "pin_memory": False, "prefetch_factor": 2,
                         "persistent_workers": False,
                         "iterators": [{"type": "_MultiProcessingDataLoaderIter", "batches_yielded": 3,
                                        "batches_in_flight": 4, "batches_ready": 0,
                                        "workers": [{"worker_id": 0, "pid": 12, "state": "running",
                                                     "cpu_percent": 99.0, "rss_bytes": 2 << 20}]}]}],
            "threads": [{"thread": "MainThread", "shares": {"dataloader_wait": 0.9},
                         "top": [{"share": 0.9, "where": "DataLoader __next__ waiting (called at f() a.py:3)"}]}],
            "sampled_s": 1.0}
    out = io.StringIO()
    shown.result(data, Console(file=out, width=200))
    text = out.getvalue()
    assert "num_workers=2" in text and "waiting for DataLoader workers 90%" in text and "12" in text
