"""PerCall with CUDA activity exports each session as soon as it stops: a kineto session
exported after a newer one started loses every GPU timestamp (seen on an H100, torch 2.11)."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from flight_profiler.agent.profiler_sessions import PerCall


class FakeProfile:
    """Stands in for torch.profiler.profile: records when it was exported, relative to the
    other sessions' starts (the order that matters on a GPU)."""

    log: ClassVar[list[str]] = []
    count = 0

    def __init__(self, **kwargs: Any) -> None:
        FakeProfile.count += 1
        self.n = FakeProfile.count

    def start(self) -> None:
        FakeProfile.log.append(f"start {self.n}")

    def stop(self) -> None:
        FakeProfile.log.append(f"stop {self.n}")

    def export_chrome_trace(self, path: str) -> None:
        FakeProfile.log.append(f"export {self.n}")
        Path(path).write_text(json.dumps({"traceEvents": [{"session": self.n}]}))


def fake_torch() -> Any:
    return SimpleNamespace(profiler=SimpleNamespace(profile=FakeProfile),
                           cuda=SimpleNamespace(synchronize=lambda: None),
                           autograd=SimpleNamespace(profiler=SimpleNamespace(record_function=None)))


def run_calls(per_call: PerCall, n: int) -> list[Any]:
    FakeProfile.log, FakeProfile.count = [], 0
    for i in range(n):
        per_call.start(i)
        per_call.stop(i)
    return per_call.finish()


def test_cuda_sessions_are_exported_before_the_next_one_starts(tmp_path: Path) -> None:
    sessions = run_calls(PerCall(fake_torch(), {}, sync_cuda=True, export_dir=str(tmp_path)), 3)
    assert FakeProfile.log == ["start 1", "stop 1", "export 1", "start 2", "stop 2", "export 2",
                               "start 3", "stop 3", "export 3"]
    for i, session in enumerate(sessions, 1):
        dest = tmp_path / f"out{i}.json"
        session.export_chrome_trace(str(dest))  # what trace_tools.export does with each
        assert json.loads(dest.read_text())["traceEvents"] == [{"session": i}]
    assert sorted(os.listdir(tmp_path)) == ["out1.json", "out2.json", "out3.json"]


def test_an_exported_session_nobody_takes_leaves_no_file(tmp_path: Path) -> None:
    sessions = run_calls(PerCall(fake_torch(), {}, sync_cuda=True, export_dir=str(tmp_path)), 2)
    assert len(os.listdir(tmp_path)) == 2
    del sessions
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_cpu_sessions_stay_lazy(tmp_path: Path) -> None:
    # No CUDA: parsing stays off the target's thread, in the agent's (the old behaviour)
    sessions = run_calls(PerCall(fake_torch(), {}, export_dir=str(tmp_path)), 2)
    assert FakeProfile.log == ["start 1", "stop 1", "start 2", "stop 2"]
    assert [type(s) for s in sessions] == [FakeProfile, FakeProfile]
