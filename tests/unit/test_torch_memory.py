"""torch memory: summary, snapshot pickles in PyTorch's schema (CPU for real, CUDA through
schema-faithful fakes of torch.cuda), history recording, and -r recording of a method's calls."""

from __future__ import annotations

import io
import pickle
import threading
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_agent_helpers import drop_workload, make_workload, run_handler, spec  # noqa: E402

from flight_profiler.agent import hooks  # noqa: E402
from flight_profiler.agent.registry import CommandError  # noqa: E402


class PlainUnpickler(pickle.Unpickler):
    """What our report does: no globals at all, so only plain containers and scalars load."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} in a snapshot")


def load_plain(path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return PlainUnpickler(f).load()


def check_schema(snap: dict[str, Any], device_type: str) -> None:
    assert set(snap) >= {"segments", "device_traces", "allocator_settings", "flight_profiler"}
    meta = snap["flight_profiler"]
    assert meta["device_type"] == device_type and isinstance(meta["pid"], int)
    assert isinstance(meta["time"], float) and isinstance(meta["label"], str)
    for seg in snap["segments"]:
        assert {"device", "address", "total_size", "allocated_size", "active_size", "blocks"} <= set(seg)
        for block in seg["blocks"]:
            assert {"address", "size", "state", "frames"} <= set(block)
    assert isinstance(snap["device_traces"], list)
    for trace in snap["device_traces"]:
        for e in trace:
            assert {"action", "addr", "size", "time_us", "frames"} <= set(e)


@pytest.fixture
def work():
    module = make_workload()
    yield module
    drop_workload(module)


def test_summary_on_cpu(tmp_path):
    keep = torch.zeros(1 << 18)  # 1 MiB
    result, _ = run_handler("torch memory", {})
    assert result["cuda"] is False and result["devices"] == []
    assert result["rss_bytes"] > 10 * (1 << 20)
    assert result["tensors_by_device"]["cpu"]["bytes"] >= keep.untyped_storage().nbytes()


def test_cpu_snapshot_follows_the_schema(tmp_path):
    keep = torch.arange(4096, dtype=torch.float64)
    path = tmp_path / "snap.pickle"
    result, _ = run_handler("torch memory", {"mode": "snapshot", "path": str(path), "label": "t1"})
    snap = load_plain(path)
    assert pickle.loads(path.read_bytes()) == snap  # memory_viz loads it with plain pickle
    check_schema(snap, "cpu")
    assert snap["flight_profiler"]["label"] == "t1"
    seg = next(s for s in snap["segments"] if s["address"] == keep.data_ptr())
    assert seg["total_size"] == 4096 * 8 and seg["device"] == 0
    assert seg["blocks"][0]["state"] == "active_allocated"
    assert result["size"] == path.stat().st_size > 0 and result["segments"] == len(snap["segments"])


def test_record_cpu_calls_with_python_frames(work, tmp_path):
    path = tmp_path / "rec.pickle"
    i = iter(range(10**6))
    result, events = run_handler(
        "torch memory",
        {"mode": "record", "target": spec(work.__name__, "train_step"), "calls": 2, "path": str(path)},
        drive=lambda: work.train_step(next(i)),
    )
    assert result["calls_recorded"] == 2 and result["allocations"] > 0
    snap = load_plain(path)
    check_schema(snap, "cpu")
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
    assert allocs and frees
    names = {f["name"] for e in allocs for f in e["frames"]}
    assert "train_step" in names
    assert any(e["message"] == "waiting for train_step: 0 of 2 calls" for e in events)
    assert hooks.active() == []  # the hook came off


def test_record_times_out_without_calls_and_unhooks(work, tmp_path):
    with pytest.raises(CommandError) as info:
        run_handler("torch memory", {"mode": "record", "target": spec(work.__name__, "train_step"),
                                     "timeout": 0.3, "path": str(tmp_path / "r.pickle")})
    assert "no call" in info.value.message
    assert hooks.active() == [] and not (tmp_path / "r.pickle").exists()


def test_record_typo_is_not_found(work, tmp_path):
    with pytest.raises(CommandError) as info:
        run_handler("torch memory", {"mode": "record", "target": spec(work.__name__, "train_stpe"),
                                     "path": str(tmp_path / "r.pickle")})
    assert info.value.kind == "not_found" and "train_step" in info.value.message


def test_history_is_cuda_only_on_cpu():
    with pytest.raises(CommandError) as info:
        run_handler("torch memory", {"mode": "history", "history": "on"})
    assert "CUDA-only" in info.value.message and info.value.kind == "usage"


# -- CUDA through fakes that follow torch.cuda's documented schema (not verified on a GPU) ---


def fake_cuda_snapshot(with_history: bool, t0_us: float = 0.0) -> dict[str, Any]:
    frames = [{"filename": "train.py", "line": 12, "name": "train_step"}] if with_history else []
    return {
        "segments": [{
            "device": 0, "address": 139_800_000_000_000, "total_size": 20 << 20,
            "allocated_size": 8 << 20, "active_size": 8 << 20, "requested_size": 8 << 20,
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": frames,
            "blocks": [
                {"address": 139_800_000_000_000, "size": 8 << 20, "requested_size": 8 << 20,
                 "state": "active_allocated", "frames": frames},
                {"address": 139_800_008_388_608, "size": 12 << 20, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        }],
        "device_traces": [[
            {"action": "alloc", "addr": 139_800_000_000_000, "size": 8 << 20, "stream": 0,
             "time_us": t0_us + 1, "frames": frames},
            {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 1.0, "frames": frames},
        ]] if with_history else [[]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False,
                               "max_split_size": -1},
    }


@pytest.fixture
def fake_cuda(monkeypatch):
    state: dict[str, Any] = {"history": False, "calls": []}
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "memory_allocated", lambda i=0: 8 << 20)
    monkeypatch.setattr(cuda, "memory_reserved", lambda i=0: 20 << 20)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda i=0: 16 << 20)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda i=0: 20 << 20)
    monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cuda, "get_allocator_backend", lambda: "native")

    def record(enabled: Any = "all", **kwargs: Any) -> None:
        state["calls"].append((enabled, kwargs))
        state.setdefault("threads", []).append(threading.current_thread().name)
        state["history"] = enabled is not None
        if enabled is not None:  # what the allocator then records happens after this moment
            state["t0"] = time.time() * 1e6

    def snapshot() -> dict[str, Any]:
        snap = fake_cuda_snapshot(state["history"], state.get("t0", time.time() * 1e6))
        if "call_times" in state and state["history"]:  # one allocation in each call made since
            first, *rest = snap["device_traces"][0]
            snap["device_traces"][0] = [{**first, "time_us": t} for t in state["call_times"]] + rest
        return snap

    monkeypatch.setattr(cuda.memory, "_record_memory_history", record)
    monkeypatch.setattr(cuda.memory, "_snapshot", snapshot)
    return state


def test_cuda_summary_reports_fragmentation(fake_cuda, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    result, _ = run_handler("torch memory", {})
    dev = result["devices"][0]
    assert dev == {"device": "cuda:0", "allocated": 8 << 20, "reserved": 20 << 20,
                   "peak_allocated": 16 << 20, "peak_reserved": 20 << 20, "fragmentation": 12 << 20}
    assert result["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_cuda_snapshot_without_history_says_how_to_record(fake_cuda, tmp_path):
    path = tmp_path / "cuda.pickle"
    result, _ = run_handler("torch memory", {"mode": "snapshot", "path": str(path)})
    snap = load_plain(path)  # tuples (segment_pool_id) were made plain lists
    check_schema(snap, "cuda")
    assert snap["segments"][0]["segment_pool_id"] == [0, 0]
    assert any("--record-history on" in n for n in result["notes"])


def test_cuda_history_on_off(fake_cuda):
    run_handler("torch memory", {"mode": "history", "history": "on", "max_entries": 5000})
    run_handler("torch memory", {"mode": "history", "history": "off"})
    assert fake_cuda["calls"] == [("all", {"max_entries": 5000}), (None, {})]
    # on and off from two requests (two agent threads), switched by one thread of ours
    assert fake_cuda["threads"] == ["flight_profiler-cuda-history"] * 2


def test_cuda_record_enables_then_restores_history(fake_cuda, work, tmp_path):
    path = tmp_path / "cuda-rec.pickle"
    i = iter(range(10**6))
    step = work.train_step

    def train_step(n: int) -> Any:  # what the fake allocator records happens during the call
        if fake_cuda["history"]:
            fake_cuda.setdefault("call_times", []).append(time.time() * 1e6)
        return step(n)

    work.train_step = train_step
    result, _ = run_handler(
        "torch memory",
        {"mode": "record", "target": spec(work.__name__, "train_step"), "calls": 1, "path": str(path)},
        drive=lambda: work.train_step(next(i)),
    )
    assert [c[0] for c in fake_cuda["calls"]] == ["all", None]  # on around the call, then off
    # both in the agent's thread: torch keeps history's annotation callback in the thread that
    # enabled it (enabled in the target's, disabled in the agent's, torch printed "Requested
    # callback is not found" into the target's stderr on an H100)
    assert fake_cuda["threads"] == ["flight_profiler-cuda-history"] * 2
    from flight_profiler.agent import cuda_history

    assert cuda_history.owner_thread() is None  # history off: its thread is gone
    snap = load_plain(path)
    check_schema(snap, "cuda")
    # the entry from before the recording window (time_us 1.0) was trimmed away
    assert [e["time_us"] > 1.0 for e in snap["device_traces"][0]] == [True]
    assert result["calls_recorded"] == 1


def test_sites_are_named_by_python_frames_when_cpp_frames_come_first():
    # CUDA history with context "all" (torch 2.11 on an H100): C++ frames precede Python's
    from flight_profiler.agent.commands.torch_memory import _top_sites

    cpp = [{"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
           {"filename": "/lib/libc10_cuda.so", "line": 0, "name": "c10::cuda::malloc"}]
    in_torch = {"filename": "/venv/torch/nn/modules/linear.py", "line": 125, "name": "forward"}
    mine = {"filename": "/job/train.py", "line": 13, "name": "step"}
    allocs = [{"action": "alloc", "size": 4096, "frames": [*cpp, in_torch, mine]},
              {"action": "alloc", "size": 1024, "frames": [*cpp, in_torch]},
              {"action": "alloc", "size": 512, "frames": cpp}]
    sites = {row["site"]: row["bytes"] for row in _top_sites(allocs)}
    assert sites == {"/job/train.py:13 step": 4096,
                     "/venv/torch/nn/modules/linear.py:125 forward": 1024,
                     "??:0 torch::unwind::unwind()": 512}


def test_renderer_prints_path_and_sites(work, tmp_path):
    from rich.console import Console

    from flight_profiler.cli.agent_commands.torch import render_memory

    data = {"mode": "record", "path": "/x/r.pickle", "size": 2048, "summary": "3 allocations",
            "surviving_bytes": 0, "top_sites": [{"site": "train.py:12 train_step", "count": 3, "bytes": 96}]}
    out = io.StringIO()
    render_memory(data, Console(file=out, width=150))
    assert "/x/r.pickle" in out.getvalue() and "train.py:12 train_step" in out.getvalue()
    assert "budget" not in out.getvalue()
    # a recording that stopped at its --budget says why it has fewer calls than asked
    out = io.StringIO()
    render_memory({**data, "calls_recorded": 4, "calls_requested": 10, "budget_s": 0.75},
                  Console(file=out, width=150))
    assert "4 of 10 calls: the recorded calls took the --budget of 0.75 s" in out.getvalue()


def test_cli_paths_are_absolute_and_modes_exclusive(tmp_path, monkeypatch):
    from flight_profiler.errors import UsageError
    from flight_profiler.requests import parse

    monkeypatch.chdir(tmp_path)
    assert parse("torch memory -s -f snap.pickle").args["path"] == str(tmp_path / "snap.pickle")
    assert parse("torch memory -s").args["default_dir"] == str(tmp_path)
    req = parse("torch memory -r mod Cls meth -n 3 --timeout 5")
    assert req.args["target"] == {"module": "mod", "class": "Cls", "method": "meth", "nested": None}
    assert req.args["calls"] == 3 and req.args["timeout"] == 5.0
    for bad in ("torch memory -s -r m f", "torch memory mod f", "torch memory -f x.pickle"):
        with pytest.raises(UsageError):
            parse(bad)


def _ancestor_walk_frames(node: Any, py_call: Any) -> list[dict[str, Any]]:
    """The stacks as the recorder first built them, one walk up from each allocation: the
    nearest PyCall's call site, then every PyCall's caller, innermost first."""
    raw: list[dict[str, Any] | None] = []
    p, first = node.parent, True
    while p is not None and len(raw) < 64:
        if p.tag == py_call:
            fields = p.typed[1]
            for state in ([fields.callsite] if first else []) + [fields.caller]:
                raw.append({"filename": str(state.file_name), "line": int(state.line_number),
                            "name": str(state.function_name)})
            first = False
        p = p.parent
    out: list[dict[str, Any]] = []
    for f in raw:
        if f is not None and not (out and out[-1] == f):
            out.append(f)
    return out


def test_recorded_stacks_are_each_allocations_python_ancestors():
    from flight_profiler.agent import memory_snapshot

    def inner(n: int) -> Any:
        return torch.ones(n) * 2

    def outer() -> Any:
        return [inner(n) for n in range(1, 40)]

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True, with_stack=True)
    with prof:
        outer()
    events, known = memory_snapshot.events_from_profiler(prof)
    kinds = torch._C._profiler._EventType
    expected: dict[tuple[int, float], list[dict[str, Any]]] = {}
    walk = list(prof.profiler.kineto_results.experimental_event_tree())
    while walk:
        node = walk.pop()
        walk.extend(node.children)
        if node.tag == kinds.Allocation and int(node.typed[1].alloc_size) > 0:
            expected[(int(node.typed[1].ptr), node.start_time_ns / 1000.0)] = (
                _ancestor_walk_frames(node, kinds.PyCall))
    allocs = [e for e in events if e["action"] == "alloc"]
    assert known and len(allocs) == len(expected) >= 39
    for e in allocs:
        assert e["frames"] == expected[(e["addr"], e["time_us"])]
    assert any(f["name"] == "inner" for f in allocs[-1]["frames"])


def test_recorded_stacks_are_written_once_per_python_call(work, tmp_path):
    # One LBFGS step makes ~17,000 allocations under ~11 frames each: a dict per frame per
    # allocation made a 28 MB pickle of 3 steps (5 MB shared) and seconds of recording.
    path = tmp_path / "rec.pickle"
    i = iter(range(10**6))
    run_handler("torch memory", {"mode": "record", "target": spec(work.__name__, "train_step"),
                                 "calls": 2, "path": str(path)},
                drive=lambda: work.train_step(next(i)))
    allocs = [e for e in load_plain(path)["device_traces"][0] if e["action"] == "alloc"]
    stacks = [e["frames"] for e in allocs if e["frames"]]
    frames = [f for stack in stacks for f in stack]
    assert len(stacks) > 10
    # Equal frames are one object (across the calls' sessions too) and stacks are shared.
    assert len({id(f) for f in frames}) == len({(f["filename"], f["line"], f["name"]) for f in frames})
    assert len({id(s) for s in stacks}) < len(stacks) / 2
