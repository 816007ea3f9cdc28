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


def _training_trace(tmp_path: Path) -> str:
    """One training thread with every kind of span training_work tells apart, repeated."""
    events: list[dict] = [  # type: ignore[type-arg]
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000}]
    for k in range(5):
        t = 1.0 + k * 190
        events += [
            _x("python_function", "train.py(10): step", t, 180),
            _x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 1, 20),
            _x("python_function", "site-packages/torch/utils/data/dataloader.py(700): __next__", t + 2, 15),
            _x("cpu_op", "aten::mm", t + 30, 30),
            _x("cpu_op", "DistributedDataParallel.forward", t + 25, 40),
            _x("python_function", "<built-in function sleep>", t + 70, 10),
            _x("python_function", "<built-in method acquire of _thread.lock object at 0x7f>", t + 85, 10),
            _x("python_function", "<built-in method run_backward of torch._C._EngineBase object>", t + 100, 50),
            _x("cpu_op", "aten::add", t + 110, 10),
            _x("python_function", "torch/distributed/distributed_c10d.py(2500): all_reduce", t + 155, 20),
            _x("cpu_op", "c10d::allreduce_", t + 156, 15),
        ]
    p = tmp_path / "train.json"
    p.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    return str(p)


def test_training_work_tells_each_kind_of_span_apart(tmp_path: Path) -> None:
    from flight_profiler.report.job_work import training_work

    work = training_work(load_trace(_training_trace(tmp_path)))
    assert work is not None and work["ddp"] and work["python_frames"]
    assert work["wait_from"] == "ddp" and work["steps"] == 1 and work["window_us"] == 1000
    # 5 rounds: collective 20 (wait) + backward's 40 outside operators; DataLoader 20; sleep 10;
    # lock 10; operators: mm/DDP forward 40 + add 10 outside the above
    assert (work["wait_us"], work["data_us"], work["sleep_us"], work["blocked_us"],
            work["compute_us"]) == (300.0, 100.0, 50.0, 50.0, 250.0)


def test_a_traces_nesting_is_built_once_for_all_its_readers(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The step's stacks (trace_metrics) and the training thread's lines (job_work) both read the
    # training thread's nesting: on a with_stack trace of 3 LBFGS steps, 0.3 s each time.
    from flight_profiler.report import loaders, stacks

    built: list[int] = []
    real = stacks._nest

    def counting(th):  # type: ignore[no-untyped-def]
        built.append(id(th))
        return real(th)

    monkeypatch.setattr(stacks, "_nest", counting)
    result = loaders.load_one(_training_trace(tmp_path))
    assert result.ok and result.data["distributed"]["work"]["lines"]
    assert built and len(built) == len(set(built))
