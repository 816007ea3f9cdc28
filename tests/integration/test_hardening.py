"""The adversarial pass of issue 10, against real targets, real gdb and a real second uid:
root never acts on a path the target's user planted; a request never freezes the target; an
agent whose socket vanished is reached again; detach never injects; dead targets' files go."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flight_profiler.agent import protocol
from flight_profiler.api import connect
from flight_profiler.errors import UsageError
from flight_profiler.requests import parse
from support import PYTHONS, Target, spawn, temp_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLI = [sys.executable, "-m", "flight_profiler"]
PYTHON = PYTHONS.get("3.11") or next(iter(PYTHONS.values()))
USER = 65534

BEATING = """
import os, sys, time
os.write(1, b"READY\\n")
def fp_beat(i):
    return i + 1
i = 0
while True:
    i = fp_beat(i)
    os.write(1, f"hb {i}\\n".encode())
    time.sleep(0.02)
"""


def run_cli(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def beats(t: Target) -> int:
    lines = [ln for ln in t.stdout.splitlines() if ln.startswith("hb ")]
    return int(lines[-1].split()[1]) if lines else 0


def assert_beating(t: Target, by: int = 5, timeout: float = 20.0) -> None:
    start, deadline = beats(t), time.monotonic() + timeout
    while beats(t) < start + by:
        assert time.monotonic() < deadline, "the target stopped beating"
        assert t.alive(), t.stderr[-2000:]
        time.sleep(0.05)


@pytest.fixture
def target() -> Iterator[Target]:
    t = spawn(BEATING, python=PYTHON)
    try:
        yield t
    finally:
        t.stop()


@pytest.fixture
def users_target() -> Iterator[subprocess.Popen[bytes]]:
    """A target run by uid 65534: what `sudo flight_profiler PID` meets on a user's job."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run a target as another user")
    tmp = Path(tempfile.mkdtemp(prefix="fp-user-"))
    tmp.chmod(0o777)
    script, out = tmp / "t.py", tmp / "out"
    script.write_text(BEATING)
    with open(out, "wb") as f:
        proc = subprocess.Popen(["setpriv", "--reuid", str(USER), "--regid", str(USER),
                                 "--clear-groups", PYTHON, str(script)], stdout=f,
                                stderr=subprocess.STDOUT, cwd="/")
    deadline = time.monotonic() + 20
    while b"READY" not in out.read_bytes():
        assert time.monotonic() < deadline and proc.poll() is None, out.read_bytes()
        time.sleep(0.05)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def as_user(code: str) -> None:
    subprocess.run(["setpriv", "--reuid", str(USER), "--regid", str(USER), "--clear-groups",
                    sys.executable, "-c", code], check=True, timeout=60, cwd="/")


def test_root_refuses_a_lock_symlink_planted_by_the_targets_user(users_target) -> None:
    pid = users_target.pid
    private = protocol.socket_dir(USER)
    as_user(f"import os\ntry:\n    os.mkdir({private!r}, 0o700)\nexcept FileExistsError:\n    pass\n")
    victim_dir = temp_dir("fp-victim-")  # root-only, like /etc
    victim = victim_dir / "nologin"
    lock = os.path.join(private, protocol.lock_name(pid, protocol.pid_namespace(pid)))
    try:
        # GIVEN the user pointed the target's attach lock at a file only root could create
        as_user(f"import os; os.symlink({str(victim)!r}, {lock!r})")
        # WHEN root attaches THEN it refuses in one line, and creates nothing
        proc = run_cli(str(pid), "--cmd", "status", "--timeout", "20")
        assert proc.returncode == 4, proc.stderr
        assert proc.stderr.startswith("error: ") and "not a regular file" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not victim.exists() and list(victim_dir.iterdir()) == []
        # and once the link is gone, root attaches and leaves no lock file behind
        os.unlink(lock)
        proc = run_cli(str(pid), "--cmd", "detach", "--timeout", "20")  # no agent: no inject
        assert proc.returncode == 0 and "nothing to detach" in proc.stdout, proc
        proc = run_cli(str(pid), "--cmd", "status", "--json", "--timeout", "20")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["pid"] == pid
        assert not os.path.lexists(lock)
        with connect(pid) as session:
            session.detach()
    finally:
        shutil.rmtree(victim_dir, ignore_errors=True)


def test_detach_without_an_agent_says_so_and_injects_nothing(target) -> None:
    log = protocol.log_path(target.pid, os.geteuid())
    proc = run_cli(str(target.pid), "--cmd", "detach", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["detached"] is False
    assert not os.path.exists(log)  # no bootstrap ran: it would have opened its log
    assert "_flight_profiler_agent" not in target.stdout + target.stderr
    assert_beating(target)


def test_agent_whose_socket_vanished_is_reached_again_with_its_state(target) -> None:
    # GIVEN an attached agent running a watch (a hook in the target), whose socket a tmp
    # cleaner then removed
    with connect(target.pid, timeout=30) as watcher:
        watch = parse("watch __main__ fp_beat")
        req = watcher._client().start(watch.cmd, watch.args)
        assert next(watcher._client().messages(req))[0] == "event"  # the hook is in
        sock = protocol.socket_path(target.pid, os.geteuid())
        os.unlink(sock)
        # WHEN a CLI attaches again THEN it reaches the same agent (hook still there)
        proc = run_cli(str(target.pid), "--cmd", "status", "--json", "--timeout", "30")
        assert proc.returncode == 0, proc.stderr
        status = json.loads(proc.stdout)
        assert status["active_hooks"], status
        assert os.path.exists(sock)
        # and detach works (it used to fail with a wrong message about the GIL)
        watcher._client().cancel(req)
        watcher._client().drain(req)
    proc = run_cli(str(target.pid), "--cmd", "detach")
    assert proc.returncode == 0 and "detached" in proc.stdout, proc.stderr
    assert not os.path.exists(sock)
    assert_beating(target)


def test_huge_expression_through_the_api_never_reaches_the_target(target) -> None:
    with connect(target.pid, timeout=30) as session:
        start = time.monotonic()
        with pytest.raises(UsageError):
            watch = parse("watch __main__ fp_beat")
            session.request(watch.cmd, {**watch.args, "expr": "x+" * (5 * 1024 * 1024) + "x"})
        assert time.monotonic() - start < 5.0  # was: the target frozen > 100 s, 10 GB
        assert session.request("status")["active_hooks"] == []
        assert_beating(target)
        session.detach()


def test_killed_targets_socket_log_and_lock_are_swept_at_the_next_attach(target) -> None:
    victim = spawn(BEATING, python=PYTHON)
    try:
        with connect(victim.pid, timeout=30):
            pass
        uid = os.geteuid()
        left = [protocol.socket_path(victim.pid, uid), protocol.log_path(victim.pid, uid)]
        deadline = time.monotonic() + 10  # the agent logs its first line just after it listens
        while not all(os.path.exists(p) for p in left):
            assert time.monotonic() < deadline, left
            time.sleep(0.05)
        victim.popen.kill()
        victim.popen.wait(10)
        # WHEN another process is attached (an injection sweeps the directory)
        with connect(target.pid, timeout=30) as session:
            assert session.injected
            session.detach()
        # THEN what the killed one left is gone, and no lock file of either stays
        assert not any(os.path.exists(p) for p in left)
        # (other CLIs may share this directory: look only at these two processes' names)
        locks = {protocol.lock_name(pid) for pid in (victim.pid, target.pid)}
        assert not locks & set(os.listdir(protocol.socket_dir(uid)))
    finally:
        victim.stop()


TWIN = """
import os, time
os.write(1, f"READY nspid={os.getpid()}\\n".encode())
def fp_twin():
    while True:
        time.sleep(0.05)
fp_twin()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare for pid namespaces")
def test_pid_namespace_twins_sharing_tmp_each_get_their_own_agent(tmp_path) -> None:
    # GIVEN two targets that are both pid 1 of their own pid namespace and share our /tmp
    outers, pids = [], []
    try:
        for n in range(2):
            out = tmp_path / f"out{n}"
            with open(out, "wb") as f:
                outers.append(subprocess.Popen(
                    ["unshare", "--pid", "--fork", "--mount-proc", PYTHON, "-c", TWIN],
                    stdout=f, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 20
            while "READY nspid=1" not in out.read_text():
                assert time.monotonic() < deadline and outers[-1].poll() is None, out.read_text()
                time.sleep(0.05)
            children = Path(f"/proc/{outers[-1].pid}/task/{outers[-1].pid}/children").read_text()
            pids.append(int(children.split()[0]))
        # WHEN both are attached
        sessions = [connect(pid, timeout=30) for pid in pids]
        try:
            # THEN each answers as itself, through its own socket
            for session in sessions:
                assert session.hello["pid"] == 1
                assert session.request("status")["pid"] == 1
            names = {protocol.socket_name(1, protocol.pid_namespace(pid)) for pid in pids}
            assert len(names) == 2
            assert all(os.path.exists(os.path.join(protocol.socket_dir(0), n)) for n in names)
            # and detaching one leaves the other reachable
            sessions[0].detach()
            with connect(pids[1], timeout=30) as again:
                assert not again.injected
        finally:
            for session in sessions:
                session.close()
        with connect(pids[1], timeout=30) as last:
            last.detach()
    finally:
        for pid in pids:
            os.kill(pid, 9)
        for outer in outers:
            outer.wait(10)


HOT = """
import os, threading, time
os.write(1, b"READY\\n")
def fp_hot(x):
    return x * 2
def worker():
    x = 0
    while True:
        x = fp_hot(x) % 1000
threading.Thread(target=worker, name="trainer", daemon=True).start()
while True:
    time.sleep(0.1)
"""


def _agent_threads(session) -> list[str]:
    threads = session.run("stack --all")["threads"]
    return sorted(t["name"] for t in threads if t["name"].startswith("flight_profiler-"))


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_flooding_watches_leave_no_thread_and_no_memory_behind(spawn_target) -> None:
    # GIVEN a hot method called in a tight loop by a worker thread
    t = spawn_target(HOT, python=PYTHON)
    watch = parse("watch __main__ fp_hot --timeout 1")
    with connect(t.pid, timeout=30) as session:
        session.request("status")
        # one watch read to the end, so that every lazily imported module is in
        session.request(watch.cmd, watch.args)
        before_threads = _agent_threads(session)
    before_rss = _rss_kb(t.pid)
    # WHEN three watches flood clients that read nothing, stay connected past the agent's
    # flush timeouts (5 s to queue the end, 5 s to send it), then go away
    sessions = [connect(t.pid, timeout=30) for _ in range(3)]
    try:
        for session in sessions:
            session._client().start(watch.cmd, watch.args)
        time.sleep(12.0)
    finally:
        for session in sessions:
            session.close()
    # THEN the agent's threads come back to what they were, and memory does not pile up
    with connect(t.pid, timeout=30) as session:
        deadline = time.monotonic() + 20
        while _agent_threads(session) != before_threads:
            assert time.monotonic() < deadline, (before_threads, _agent_threads(session))
            time.sleep(0.2)
        grown_mb = (_rss_kb(t.pid) - before_rss) / 1024
        assert grown_mb < 64, f"target grew {grown_mb:.0f} MB after 3 flooding watches"
        assert session.request("status")["active_hooks"] == []
        session.detach()
