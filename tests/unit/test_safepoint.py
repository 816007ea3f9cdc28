"""Tensor walks run in the main thread between bytecodes, never racing a torch op."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from flight_profiler.agent.safepoint import SafePointTimeout, run_in_main_thread
from support import PYTHONS


def test_runs_in_the_main_thread_while_it_executes_python() -> None:
    # GIVEN a worker asking for a function to run; WHEN the main thread is busy in Python
    seen: dict[str, object] = {}

    def ask() -> None:
        seen["result"] = run_in_main_thread(
            lambda: threading.current_thread() is threading.main_thread(), timeout=10)

    worker = threading.Thread(target=ask)
    worker.start()
    deadline = time.monotonic() + 10
    while worker.is_alive() and time.monotonic() < deadline:
        sum(range(1000))  # bytecodes: the eval loop checks for pending calls
    worker.join(1)
    # THEN it ran in the main thread and its result came back to the worker
    assert seen["result"] is True


def test_errors_come_back_to_the_caller_not_the_main_thread() -> None:
    box: dict[str, BaseException] = {}

    def boom() -> None:
        raise ValueError("inside")

    def ask() -> None:
        try:
            run_in_main_thread(boom, timeout=10)
        except ValueError as exc:
            box["error"] = exc

    worker = threading.Thread(target=ask)
    worker.start()
    while worker.is_alive():
        sum(range(1000))
    assert str(box["error"]) == "inside"


def test_a_blocked_main_thread_times_out_and_the_function_never_runs() -> None:
    # GIVEN a main thread blocked in a native call (a long sleep: no bytecodes run)
    ran: list[bool] = []
    box: dict[str, BaseException] = {}

    def ask() -> None:
        time.sleep(0.2)  # let the main thread enter its sleep first
        try:
            run_in_main_thread(lambda: ran.append(True), timeout=0.3)
        except SafePointTimeout as exc:
            box["error"] = exc

    worker = threading.Thread(target=ask)
    worker.start()
    time.sleep(1.5)
    worker.join()
    # WHEN the main thread runs Python again, the abandoned call is dropped
    for _ in range(1000):
        sum(range(100))
    # THEN the caller got a timeout and the function never ran
    assert isinstance(box["error"], SafePointTimeout)
    assert ran == []


def test_called_from_the_main_thread_runs_at_once() -> None:
    assert run_in_main_thread(lambda: 42, timeout=0.01) == 42


@pytest.mark.parametrize("n", [40])
def test_more_requests_than_the_pending_queue_holds_do_not_crash(n: int) -> None:
    results: list[object] = []

    def ask() -> None:
        try:
            results.append(run_in_main_thread(lambda: 1, timeout=5))
        except SafePointTimeout:
            results.append("full")

    workers = [threading.Thread(target=ask) for _ in range(n)]
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        sum(range(1000))
    assert len(results) == n and results.count(1) >= 1
    assert set(results) <= {1, "full"}


_EVERY_VERSION = r'''
import importlib.util, sys, threading, time
spec = importlib.util.spec_from_file_location("sp", sys.argv[1])
sp = importlib.util.module_from_spec(spec); spec.loader.exec_module(sp)
res = {}
def ask():
    res["main"] = sp.run_in_main_thread(
        lambda: threading.current_thread() is threading.main_thread(), 5)
w = threading.Thread(target=ask); w.start()
while w.is_alive(): sum(range(1000))
ran = []
def ask2():
    time.sleep(0.2)
    try: sp.run_in_main_thread(lambda: ran.append(1), 0.3)
    except sp.SafePointTimeout: res["timeout"] = True
w = threading.Thread(target=ask2); w.start(); time.sleep(1.0); w.join()
for _ in range(1000): sum(range(100))
print(res.get("main"), res.get("timeout"), ran)
'''


@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_safe_point_on_every_interpreter(version: str) -> None:
    # The agent runs in targets of every version: Py_AddPendingCall must reach the main
    # thread there too, and an abandoned call must never run.
    path = Path(__file__).resolve().parents[2] / "src/flight_profiler/agent/safepoint.py"
    out = subprocess.run([PYTHONS[version], "-c", _EVERY_VERSION, str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "[]"]
