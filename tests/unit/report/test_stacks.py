"""Nesting per thread: callers at a point in time and operators' self time, out-of-order input."""

from __future__ import annotations

import json
from pathlib import Path

from flight_profiler.report.stacks import CallerIndex, operator_self_times
from flight_profiler.report.trace_loader import load_trace


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:  # type: ignore[type-arg]
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_callers_and_self_time_with_events_out_of_order(tmp_path: Path) -> None:
    events = [
        _x("cpu_op", "aten::b", 20, 10),                         # child written before parent
        _x("python_function", "train.py(10): step", 0, 100),
        _x("python_function", "site-packages/torch/x.py(5): f", 21, 8),
        _x("cpu_op", "aten::a", 10, 40),
        _x("cpu_op", "aten::c", 60, 5),
        _x("cpu_op", "aten::a", 70, 4, tid=2),                  # another thread
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    raw = load_trace(str(p))
    key1 = next(k for k in raw.threads if len(raw.threads[k].ts) == 5)
    index = CallerIndex(raw)
    at = dict(zip(["in b", "in a only", "in c", "after", "before"],
                  index.resolve([(key1, 25), (key1, 45), (key1, 62), (key1, 200), (key1, -1)])))
    assert at["in b"] == ("train.py:10 (step)", ["aten::a", "aten::b"])
    assert at["in a only"] == ("train.py:10 (step)", ["aten::a"])
    assert at["in c"] == ("train.py:10 (step)", ["aten::c"])
    assert at["after"] == (None, []) and at["before"] == (None, [])
    stats, _ = operator_self_times(raw)
    assert stats["aten::a"] == [2, 44.0, 34.0]  # 40 - 10 (aten::b) + 4 on thread 2
    assert stats["aten::b"] == [1, 10.0, 10.0]


def test_where_is_the_programs_innermost_frame_with_the_library_frames_inside_it() -> None:
    from flight_profiler.report.stacks import where_frame

    # a rank hung in its queue: the program's wait_for_batch, then queue and threading
    paths = ["/home/u/train.py", "/home/u/train.py",
             "/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py",
             "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py"]
    assert where_frame(paths) == (1, [2, 3])
    # torch's traces strip the sys.path prefixes: the stdlib is told by its module names
    assert where_frame(["train.py", "queue.py", "threading.py"]) == (0, [1, 2])
    assert where_frame(["train.py", "multiprocessing/queues.py"]) == (0, [1])
    # no frame of the program (a library's thread): the innermost outside the stdlib
    lib = "/v/lib/python3.11/site-packages/lightning/trainer.py"
    assert where_frame(["/usr/lib/python3.11/threading.py", lib, "/usr/lib/python3.11/queue.py"]) == (1, [2])
    assert where_frame([]) == (-1, [])


def test_frame_origin_tells_the_program_from_the_stdlib_and_libraries() -> None:
    from flight_profiler.report.stacks import LIBRARY, PROGRAM, STDLIB, frame_origin

    assert frame_origin("/usr/lib64/python3.12/threading.py") == STDLIB
    assert frame_origin("/usr/lib/python3/dist-packages/numpy/core.py") == LIBRARY
    assert frame_origin("/w/.venv/lib/python3.11/site-packages/torch/autograd/graph.py") == LIBRARY
    assert frame_origin("torch/nn/modules/module.py") == LIBRARY
    assert frame_origin("<frozen importlib._bootstrap>") == STDLIB
    assert frame_origin("/srv/job/train.py") == PROGRAM
    # a user's script named like a stdlib module is the program's
    assert frame_origin("test.py") == PROGRAM and frame_origin("queue.py") == STDLIB
    # the bundled sample programs are programs (a trace names them sys.path-relative), our
    # agent and its staged copy are not
    assert frame_origin("flight_profiler/workloads/tiny_ops.py") == PROGRAM
    assert frame_origin("/repo/src/flight_profiler/workloads/tiny_ops.py") == PROGRAM
    assert frame_origin("flight_profiler/agent/hooks.py") == LIBRARY
    assert frame_origin("/tmp/flight_profiler-code/0.1/flight_profiler/agent/hooks.py") == LIBRARY


def test_a_traces_user_frame_is_never_a_stdlib_wait(tmp_path: Path) -> None:
    # the training thread waits in queue.get inside wait_for_batch: the line to name is the
    # program's (the old markers knew threading.py but not queue.py)
    events = [
        _x("python_function", "train.py(94): wait_for_batch", 0, 100),
        _x("python_function", "queue.py(171): get", 1, 98),
        _x("python_function", "threading.py(327): wait", 2, 96),
        _x("cpu_op", "aten::empty", 50, 1),
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    raw = load_trace(str(p))
    [key] = list(raw.threads)
    [(user, _ops)] = CallerIndex(raw).resolve([(key, 50.5)])
    assert user == "train.py:94 (wait_for_batch)"
