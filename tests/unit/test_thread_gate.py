"""thread_gate holds every other Python thread at a safe point on each installed CPython, and
lets them all go afterwards with no profile function left behind."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from support import PYTHONS

GATE_SCRIPT = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from flight_profiler.agent import thread_gate

counts = {"busy": 0}
stop = threading.Event()

def step():
    return sum(range(50))

def busy():                        # a worker doing short steps between Python calls
    while not stop.is_set():
        step()
        counts["busy"] += 1

def parked():                      # a thread waiting in a known blocking call
    stop.wait()

held_lock = threading.Lock()
held_lock.acquire()

def aliased():                     # the stdlib's shape (multiprocessing's queue feeder thread):
    nacquire = held_lock.acquire   # a blocking builtin bound to a local, then called
    nacquire()
    held_lock.release()
    out["aliased_done"] = True

own_events = [0]
def own_profiler(frame, event, arg):
    own_events[0] += 1

def profiled():                    # a thread that runs its own profiler (cProfile-like)
    sys.setprofile(own_profiler)
    while not stop.is_set():
        step()
        time.sleep(0.001)
    out["own_profile_kept"] = sys.getprofile() is own_profiler

out = {}
threads = [threading.Thread(target=busy, name="busy"), threading.Thread(target=parked, name="parked"),
           threading.Thread(target=profiled, name="profiled"), threading.Thread(target=aliased, name="aliased")]
for t in threads: t.start()
time.sleep(0.1)

def inside():
    before = counts["busy"]
    time.sleep(0.2)                # the walk: nothing else may run meanwhile
    return counts["busy"] - before

def agent():
    t0 = time.monotonic()
    out["moved_while_held"] = thread_gate.run_with_threads_held(inside, 2.0)
    out["took"] = time.monotonic() - t0
    before = counts["busy"]
    events = own_events[0]
    # both threads go on after the release; on a loaded machine a thread may wait a while for
    # the GIL and the CPU (seen in CI: no profile event within 0.2 s), so wait up to 5 s for it
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (counts["busy"] == before or own_events[0] == events):
        time.sleep(0.01)
    out["moved_after"] = counts["busy"] - before
    out["own_events_after"] = own_events[0] - events

def refused():                   # no gate here: refused at once, nothing held
    try:
        thread_gate.run_with_threads_held(inside, 2.0)
    except thread_gate.GateUnsupported:
        out["refused"] = True

a = threading.Thread(target=agent if thread_gate.supported() else refused, name="flight_profiler-test")
a.start()
while a.is_alive():                # the main thread stays busy in Python too
    step()
stop.set()
held_lock.release()
for t in threads: t.join()
out["profile_left"] = sys.getprofile() is not None
out["supported"] = thread_gate.supported()
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_every_thread_is_held_then_released(version: str, tmp_path: Path) -> None:
    script = tmp_path / "gate.py"
    script.write_text(GATE_SCRIPT)
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([PYTHONS[version], str(script), src], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if not out["supported"]:
        # the gate refuses at once (on 3.14 it had deadlocked under load), and nothing is left
        assert out["refused"] is True and out["profile_left"] is False, out
        pytest.skip(f"no thread gate on Python {version} (the main-thread safe point is used)")
    # THEN the busy worker made no step while held, and went on afterwards; the parked thread
    # did not hold the gate up, nor did one blocked in a lock's acquire called through a local
    # alias (and it went on once the lock was free); the main thread has no profile function left
    assert out["moved_while_held"] == 0
    assert out["moved_after"] > 0
    assert out["took"] < 2.0
    assert out["aliased_done"] is True
    assert out["profile_left"] is False
    # and a thread's own profiler was given back and kept receiving events
    assert out["own_profile_kept"] is True
    assert out["own_events_after"] > 0
    assert proc.stderr == ""


def test_a_child_forked_while_the_gate_is_on_is_never_held() -> None:
    # A DataLoader worker forked while a census held the threads inherits the gate's profile
    # function on its one thread; nobody in the child will release it (seen in CI: the worker
    # waited for ever, and the job's loop with it). In a process other than the gate's, the
    # function returns at once.
    import os

    from flight_profiler.agent import thread_gate

    st = thread_gate._STATE
    saved = (st.active, st.pid, st.owner)
    st.active, st.pid, st.owner = True, os.getpid() + 1, threading.current_thread()
    st.release.clear()
    try:
        t0 = time.monotonic()
        assert thread_gate._on_event(None, None, 0, None) == 0
        assert time.monotonic() - t0 < 0.5 and threading.get_ident() not in st.held
    finally:
        st.active, st.pid, st.owner = saved
