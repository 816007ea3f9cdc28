"""Attach to real CPython processes (3.9-3.13) in the states a training job's main thread can be
in, with real gdb and real sockets; the targets must survive and keep running correctly."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attach_targets import STATES, TARGET

from flight_profiler.agent import protocol
from flight_profiler.api import connect
from support import PYTHONS, Target, other_user_can_run_us, spawn, temp_dir, torch_available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLI = [sys.executable, "-m", "flight_profiler"]
FULL_MATRIX_VERSIONS = ("3.9", "3.12")  # threading repair differs there; all states on these
SMALL_STATES = ("sleeping", "busy")  # on every other version

# Debian's own python3.11: statically linked libpython, stripped (no debug info at all)
INTERPRETERS = dict(PYTHONS)
if os.path.exists("/usr/bin/python3.11"):
    INTERPRETERS["3.11-distro-static"] = "/usr/bin/python3.11"


def _cases() -> list[object]:
    cases: list[object] = []
    for version in INTERPRETERS:
        states = STATES if version in FULL_MATRIX_VERSIONS else SMALL_STATES
        for state in states:
            # the GIL hog waits out several long C calls: a few seconds each
            if state == "syscall_loop":
                continue  # its own test below: the agent may come up late there
            marks = [pytest.mark.slow] if state == "gil_hog" else []
            cases.append(pytest.param(version, state, marks=marks, id=f"{version}-{state}"))
    return cases


class StateTarget:
    def __init__(self, version: str, state: str) -> None:
        self.stop_file = temp_dir("fp-stop-") / "stop"
        self.target: Target = spawn(TARGET, python=INTERPRETERS[version],
                                    args=(state, str(self.stop_file)))
        self.pid = self.target.pid

    def beats(self) -> int:
        found = re.findall(r"^hb (\d+)$", self.target.stdout, re.M)
        return int(found[-1]) if found else 0

    def assert_advances(self, by: int = 3, timeout: float = 20.0) -> None:
        start = self.beats()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.beats() >= start + by:
                return
            assert self.target.alive(), f"target died: {self.target.stderr[-2000:]}"
            time.sleep(0.05)
        raise AssertionError(f"heartbeat stuck at {self.beats()} (target hung?)")

    def finish(self) -> None:
        """Stop the target the normal way: it must exit 0 with a correct main thread."""
        self.stop_file.touch()
        rc = self.target.popen.wait(30)
        assert rc == 0, f"target exit {rc}: {self.target.stderr[-2000:]}"
        assert "main_ok True True" in self.target.stdout
        # nothing from the agent in the target's own output
        assert self.target.stderr == ""
        lines = [ln for ln in self.target.stdout.splitlines()
                 if not re.match(r"^(READY|hb \d+|main_ok .*)$", ln)]
        assert lines == []

    def kill(self) -> None:
        self.stop_file.touch()
        self.target.stop()


@pytest.fixture
def state_target():
    made: list[StateTarget] = []

    def make(version: str, state: str) -> StateTarget:
        t = StateTarget(version, state)
        made.append(t)
        return t

    yield make
    for t in made:
        t.kill()


def run_cli(*args: str, timeout: float = 60.0, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kw)


def _function_names(stack: dict) -> set[str]:
    return {frame["function"].rsplit(".", 1)[-1]
            for thread in stack["threads"] for frame in thread["frames"]}


def test_beside_a_loop_of_short_system_calls_the_target_is_unharmed(state_target) -> None:
    # GIVEN a main thread that releases and retakes the GIL every few hundred microseconds:
    # CPython's GIL convoy can keep the agent's thread waiting (docs/attach.md, known limitation)
    t = state_target(next(iter(INTERPRETERS)), "syscall_loop")
    t.assert_advances(1)
    # WHEN the CLI attaches
    proc = run_cli(str(t.pid), "--cmd", "stack", "--json", "--timeout", "30")
    # THEN it either answers or times out saying so; nothing else, and the target is unharmed
    assert proc.returncode in (0, 7), proc.stderr
    if proc.returncode == 0:
        assert STATES["syscall_loop"] in _function_names(json.loads(proc.stdout))
    else:
        # with --json the error is a JSON document on stdout, not a line on stderr
        error = json.loads(proc.stdout)["error"]
        assert "did not come up" in error["message"] and error["exit_code"] == 7, error
    t.assert_advances(3)
    run_cli(str(t.pid), "--cmd", "detach")
    t.finish()


@pytest.mark.parametrize(("version", "state"), _cases())
def test_attach_stack_detach_keeps_target_healthy(state_target, version: str, state: str) -> None:
    # GIVEN a live target whose main thread is in `state`
    t = state_target(version, state)
    t.assert_advances(1)
    # WHEN the CLI attaches and asks for the stacks
    proc = run_cli(str(t.pid), "--cmd", "stack", "--json", "--timeout", "30")
    # THEN the target's own functions show up, the agent's threads are hidden
    assert proc.returncode == 0, proc.stderr
    stack = json.loads(proc.stdout)
    assert STATES[state] in _function_names(stack)
    assert all(not th["agent"] for th in stack["threads"])
    assert stack["hidden_agent_threads"] >= 1
    main = [th for th in stack["threads"] if th["main"]]
    assert len(main) == 1 and main[0]["native_id"] in (None, t.pid)
    # a later command reuses the agent
    with connect(t.pid, timeout=10) as session:
        assert not session.injected
        status = session.request("status")
        assert status["pid"] == t.pid
        assert status["python"]["version"].startswith(version.split("-")[0])
        assert status["active_hooks"] == []
        assert status["torch"]["imported"] is False
        session.detach()
    assert not os.path.exists(protocol.socket_path(t.pid, os.geteuid()))
    # the target keeps working, and ends normally with nothing printed by the agent
    t.assert_advances(3)
    t.finish()


def test_reattach_reuses_agent_fast_and_detach_then_attach_injects_again(state_target) -> None:
    t = state_target("3.11" if "3.11" in PYTHONS else next(iter(PYTHONS)), "sleeping")
    first = connect(t.pid, timeout=15)
    assert first.injected
    first.close()
    timings = []
    for _ in range(5):
        with connect(t.pid) as again:
            assert not again.injected
            timings.append(again.attach_seconds)
            assert again.request("stack")["threads"]
    assert min(timings) < 0.1, timings
    with connect(t.pid) as session:
        assert session.detach()["detached"] is True
    with connect(t.pid, timeout=15) as fresh:
        assert fresh.injected
        assert STATES["sleeping"] in _function_names(fresh.run("stack"))
        fresh.detach()
    t.assert_advances(3)
    t.finish()


def test_concurrent_clients(state_target) -> None:
    import threading

    t = state_target(next(iter(PYTHONS)), "busy")
    connect(t.pid, timeout=15).close()
    results: list[object] = []

    def client(n: int) -> None:
        try:
            with connect(t.pid) as session:
                for _ in range(5):
                    cmd = "stack" if n % 2 else "status"
                    results.append(bool(session.request(cmd)))
        except Exception as exc:  # collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert results == [True] * 20
    with connect(t.pid) as session:
        session.detach()
    t.assert_advances(3)
    t.finish()


def _as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd="/",
        env={**os.environ, "HOME": "/nonexistent"},
    )


@pytest.mark.skipif(not other_user_can_run_us(), reason="needs root, setpriv, and a checkout "
                    "uid 65534 can read (not under a root-only directory)")
def test_other_user_cannot_reach_the_agent(state_target) -> None:
    t = state_target(next(iter(PYTHONS)), "sleeping")
    with connect(t.pid, timeout=15) as session:
        path = protocol.socket_path(t.pid, os.geteuid())
        # GIVEN a running agent; WHEN uid 65534 connects to its socket directly
        probe = _as_nobody(
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({path!r})\nexcept OSError as e:\n    print(e.errno)\n"
            "else:\n    print('connected')\n"
        )
        # THEN the kernel refuses (private 0700 directory)
        assert probe.stdout.strip() == "13", probe
        # and the CLI run by that user fails with the permission exit code and one line
        cli = _as_nobody(
            f"import sys; sys.argv = ['flight_profiler', '{t.pid}', '--cmd', 'stack']\n"
            "from flight_profiler.cli.main import main; main()"
        )
        assert cli.returncode == 4, cli
        assert cli.stderr.startswith("error: ") and "uid" in cli.stderr
        assert session.request("status")["pid"] == t.pid  # the agent is unaffected
        session.detach()
    t.finish()


def test_dead_pid_not_python_and_bad_command(spawn_target) -> None:
    # a pid that does not exist
    dead = subprocess.Popen(["true"])
    dead.wait()
    proc = run_cli(str(dead.pid), "--cmd", "stack")
    assert proc.returncode == 3
    assert proc.stderr.splitlines()[0] == f"error: no process with pid {dead.pid}"
    # not a Python process
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = run_cli(str(sleeper.pid), "--cmd", "stack")
        assert proc.returncode == 5
        assert "is not a CPython interpreter" in proc.stderr.splitlines()[0]
        js = run_cli(str(sleeper.pid), "--cmd", "stack", "--json")
        assert json.loads(js.stdout)["error"]["kind"] == "not_python"
    finally:
        sleeper.kill()
        sleeper.wait()
    # malformed command strings: exit 2, and the target is not touched (no agent injected)
    t = spawn_target("import time\nprint('READY', flush=True)\ntime.sleep(60)\n")
    for bad in ("stak", "stack --frobnicate", "stack --limit zero", "", 'stack "unterminated'):
        proc = run_cli(str(t.pid), "--cmd", bad)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert proc.stderr.startswith("error:") or proc.stderr.startswith("Error:"), proc.stderr
    assert not os.path.exists(protocol.socket_path(t.pid, os.geteuid()))
    assert t.alive()


def test_stale_socket_of_dead_process_is_not_trusted(state_target) -> None:
    # GIVEN an agent in a process that is then SIGKILLed (its socket file stays behind)
    t = state_target(next(iter(PYTHONS)), "sleeping")
    connect(t.pid, timeout=15).close()
    path = protocol.socket_path(t.pid, os.geteuid())
    t.target.popen.kill()
    t.target.popen.wait(10)
    assert os.path.exists(path)
    # WHEN attaching to that pid THEN it is reported as gone, not as an agent
    proc = run_cli(str(t.pid), "--cmd", "status")
    assert proc.returncode == 3, proc.stderr
    # and the client removes a stale socket it meets (ECONNREFUSED)
    from flight_profiler.client import AgentClient, NoAgent

    with pytest.raises(NoAgent):
        AgentClient.connect(path, t.pid, 0, timeout=2)
    assert not os.path.exists(path)


NATIVE_NO_GIL = r"""
import hashlib, os, sys, time
os.write(1, b"READY\n")
hashlib.pbkdf2_hmac("sha256", b"x", b"y", int(sys.argv[1]))  # long C call WITHOUT the GIL
os.write(1, b"after_call\n")
for _ in range(20):
    time.sleep(0.1)
os.write(1, f"agent_loaded {'_flight_profiler_agent' in sys.modules}\n".encode())
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", [v for v in ("3.9", "3.12") if v in PYTHONS])
def test_main_thread_in_native_code_without_gil_times_out_honestly(spawn_target, version) -> None:
    # GIVEN a main thread inside a multi-second C call that released the GIL
    t = spawn_target(NATIVE_NO_GIL, python=PYTHONS[version], args=("7000000",))
    # WHEN attaching with a short timeout
    proc = run_cli(str(t.pid), "--cmd", "stack", "--timeout", "1")
    # THEN: the documented exit code and the precise reason, on one line + hint
    assert proc.returncode == 7, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "main thread is in native code without the GIL" in first, first
    assert "retry later" in proc.stderr
    # and the target is left as it was: the late bootstrap does nothing
    t.wait_for("agent_loaded False", timeout=60)
    assert not os.path.exists(protocol.socket_path(t.pid, os.geteuid()))
    assert t.stderr == ""


IN_NAMESPACE = r"""
import os, time
os.write(1, f"READY nspid={os.getpid()}\n".encode())
def fp_in_container():
    while True:
        time.sleep(0.1)
fp_in_container()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
                    reason="needs root and unshare to build a container-like namespace")
def test_target_in_its_own_mount_and_pid_namespace(tmp_path) -> None:
    # GIVEN a target with its own pid namespace (it is pid 1 there) and a private /tmp, as in a
    # container: its /tmp is only reachable through /proc/PID/root
    python = PYTHONS.get("3.12") or next(iter(PYTHONS.values()))
    script = tmp_path / "ns.sh"
    script.write_text(f"mount -t tmpfs tmpfs /tmp\nexec {python} -c '{IN_NAMESPACE}'\n")
    out = tmp_path / "out"
    with open(out, "wb") as f:
        outer = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--mount-proc",
                                  "bash", str(script)], stdout=f, stderr=subprocess.STDOUT)
    pid = None
    try:
        deadline = time.monotonic() + 20
        while "READY nspid=1" not in out.read_text():
            assert time.monotonic() < deadline and outer.poll() is None, out.read_text()
            time.sleep(0.05)
        children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()
        pid = int(children[0])
        # WHEN attaching from the host
        proc = run_cli(str(pid), "--cmd", "stack", "--json", "--timeout", "20")
        # THEN it works through /proc/PID/root, with the namespace's pid in the socket name
        assert proc.returncode == 0, proc.stderr
        assert "fp_in_container" in _function_names(json.loads(proc.stdout))
        sock = protocol.socket_name(1, protocol.pid_namespace(pid))
        assert os.path.exists(f"/proc/{pid}/root/tmp/flight_profiler-0/{sock}")
        assert not os.path.exists(f"/tmp/flight_profiler-0/{sock}")
        with connect(pid) as session:
            assert not session.injected and session.hello["pid"] == 1
            session.detach()
        assert not os.path.exists(f"/proc/{pid}/root/tmp/flight_profiler-0/{sock}")
    finally:
        if pid is not None:
            os.kill(pid, 9)
        outer.wait(10)


def test_two_clis_attaching_at_once_share_one_agent(state_target) -> None:
    # GIVEN a fresh target; WHEN two CLIs attach at the same moment (both inject)
    t = state_target(next(iter(PYTHONS)), "sleeping")
    procs = [subprocess.Popen([*CLI, str(t.pid), "--cmd", "status", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    # THEN both succeed, and the target runs exactly one agent server
    assert [p.returncode for p in procs] == [0, 0], outs
    with connect(t.pid) as session:
        threads = session.run("stack --all")["threads"]
        servers = [th for th in threads if th["name"] == "flight_profiler-server"]
        assert len(servers) == 1, [th["name"] for th in threads]
        session.detach()
    t.assert_advances(3)
    t.finish()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a target as another user")
def test_root_attaches_to_another_users_target() -> None:
    # GIVEN a target run by uid 65534 (root's `sudo flight_profiler PID` on a user's job)
    python = PYTHONS.get("3.11") or next(iter(PYTHONS.values()))
    tmp_path = temp_dir("fp-user-")  # pytest's tmp dirs are root-only
    tmp_path.chmod(0o777)
    script = tmp_path / "t.py"
    script.write_text("import os, time\nos.write(1, b'READY\\n')\n"
                      "def fp_users_job():\n    while True:\n        time.sleep(0.1)\n"
                      "fp_users_job()\n")
    out = tmp_path / "out"
    with open(out, "wb") as f:
        target = subprocess.Popen(["setpriv", "--reuid", "65534", "--regid", "65534",
                                   "--clear-groups", python, str(script)], stdout=f,
                                  stderr=subprocess.STDOUT, cwd="/")
    try:
        deadline = time.monotonic() + 20
        while b"READY" not in out.read_bytes():
            assert time.monotonic() < deadline and target.poll() is None, out.read_bytes()
            time.sleep(0.05)
        # WHEN root attaches
        proc = run_cli(str(target.pid), "--cmd", "stack", "--json", "--timeout", "20")
        # THEN it works, and the agent's directory and socket belong to the target's user
        assert proc.returncode == 0, proc.stderr
        assert "fp_users_job" in _function_names(json.loads(proc.stdout))
        sock = protocol.socket_path(target.pid, 65534)
        st_dir, st_sock = os.lstat(os.path.dirname(sock)), os.lstat(sock)
        assert (st_dir.st_uid, st_dir.st_mode & 0o777) == (65534, 0o700)
        assert (st_sock.st_uid, st_sock.st_mode & 0o777) == (65534, 0o600)
        with connect(target.pid) as session:
            session.detach()
        assert out.read_bytes().count(b"\n") == 1  # only READY: the agent printed nothing
    finally:
        target.kill()
        target.wait(10)
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(not torch_available(), reason="torch is not installed in this venv")
def test_status_reports_torch_without_importing_it(spawn_target) -> None:
    # the venv's interpreter has torch (CPU build)
    t = spawn_target("import time, torch\nprint('READY', flush=True)\n"
                     "while True:\n    time.sleep(0.1)\n", python=sys.executable, timeout=60)
    with connect(t.pid, timeout=20) as session:
        torch_info = session.request("status")["torch"]
        import torch

        assert torch_info["imported"] is True
        assert torch_info["version"] == torch.__version__
        assert torch_info["cuda_available"] is False  # CPU build
        session.detach()
    assert t.stderr == ""


FORKING = r"""
import os, sys, time
os.write(1, b"READY\n")
flag = sys.argv[1]
while not os.path.exists(flag):
    time.sleep(0.05)
pid = os.fork()  # what a DataLoader worker does
if pid == 0:
    agent = sys.modules.get("_flight_profiler_agent.server")
    os.write(1, f"child serving={agent is not None and agent.running()}\n".encode())
    time.sleep(0.5)
    sys.exit(0)  # runs atexit handlers in the child
os.waitpid(pid, 0)
os.write(1, b"child done\n")
while True:
    time.sleep(0.1)
"""


def test_forked_child_does_not_serve_or_unlink_the_parents_socket(spawn_target, tmp_path) -> None:
    flag = tmp_path / "fork-now"
    t = spawn_target(FORKING, python=PYTHONS.get("3.12") or next(iter(PYTHONS.values())),
                     args=(str(flag),))
    with connect(t.pid, timeout=15) as session:
        flag.touch()
        t.wait_for("child done")
        assert "child serving=False" in t.stdout
        # the parent's agent is intact: same socket, still answering on this connection
        assert os.path.exists(protocol.socket_path(t.pid, os.geteuid()))
        assert session.request("status")["pid"] == t.pid
    with connect(t.pid) as again:
        assert not again.injected
        again.detach()
    # Python 3.12+ itself warns when a multi-threaded process forks from __main__ code; the
    # agent's threads make any target multi-threaded (documented in docs/attach.md).
    assert [ln for ln in t.stderr.splitlines()
            if "is multi-threaded, use of fork()" not in ln and "os.fork()" not in ln] == []


def test_target_exit_removes_the_socket(state_target) -> None:
    t = state_target(next(iter(PYTHONS)), "sleeping")
    connect(t.pid, timeout=15).close()
    path = protocol.socket_path(t.pid, os.geteuid())
    assert os.path.exists(path)
    t.finish()  # normal exit with the agent still loaded: atexit unlinks the socket
    assert not os.path.exists(path)


def test_shell_on_a_live_target_reads_commands_from_stdin(state_target) -> None:
    t = state_target(next(iter(PYTHONS)), "sleeping")
    proc = subprocess.run([*CLI, str(t.pid)], input="stack\nstak\nstatus --json\nhelp\ndetach\n",
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(temp_dir("fp-home-"))})
    assert proc.returncode == 0, proc.stderr
    assert "fp_sleeping_main" in proc.stdout  # stack ran
    assert f'"pid": {t.pid}' in proc.stdout  # `status --json` printed JSON
    assert "detached: agent stopped" in proc.stdout  # so did the commands after the error
    assert proc.stderr.strip().splitlines() == [
        proc.stderr.strip().splitlines()[0]] and "unknown command 'stak'" in proc.stderr
    assert not os.path.exists(protocol.socket_path(t.pid, os.geteuid()))
    t.finish()


WATCHED = r"""
import os, time
os.write(1, b"READY\n")
def fp_step(i):
    time.sleep(0.01)
    return i
i = 0
while True:
    fp_step(i)
    i += 1
"""


def test_ctrl_c_during_a_stream_removes_every_hook(spawn_target) -> None:
    t = spawn_target(WATCHED, python=PYTHONS.get("3.12") or next(iter(PYTHONS.values())))
    # GIVEN a CLI streaming an unbounded watch (a real terminal's Ctrl-C is a SIGINT)
    cli = subprocess.Popen([*CLI, str(t.pid), "--cmd", "watch __main__ fp_step", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert cli.stdout is not None
        first = cli.stdout.readline()
        assert json.loads(first)["event"], first
        with connect(t.pid) as session:
            assert len(session.request("status")["active_hooks"]) == 1
        # WHEN Ctrl-C
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
    # THEN exit 130, the final result still printed, and no hook left in the target
    assert cli.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert "target" in json.loads(out.strip().splitlines()[-1])
    with connect(t.pid) as session:
        assert session.request("status")["active_hooks"] == []
        session.detach()
    assert t.stderr == ""
