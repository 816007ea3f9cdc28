"""A fake agent: a real Unix socket server at the path the CLI looks for, speaking the real
protocol (agent/protocol.py) with hostile behaviours. It stands for a hostile target (or another
user's process that planted its own "agent"): the CLI, often root, must stay in control of it.

Run as the target itself (the CLI checks the socket's peer pid and the hello's start time, so
only the process being attached to can serve its socket)::

    python tests/fake_agent.py SPEC.json

and it prints READY once listening. SPEC::

    {"handshake": [ACTION...],            # default: [{"hello": {}}], the real agent's hello
     "requests": [[ACTION...], ...],      # the n-th request gets the n-th list (the last repeats;
                                          # counted over every connection)
     "by_cmd": {"status": [ACTION...]}}   # or by the request's handler name, when it has one

ACTION, one of::

    {"hello": {overrides}}                # a valid hello with some fields replaced
    {"result": DATA} / {"event": DATA} / {"error": ERROR}   # of the current request
    {"send": MESSAGE}                     # any object; "$id" strings become the request's id
    {"raw": "hex"}                        # bytes as they are
    {"trickle": ACTION, "rate": BYTES_PER_S}   # that action's frame, a few bytes at a time
    {"header_only": LENGTH}               # a frame header announcing LENGTH bytes, then nothing
    {"big_result": BYTES, "shape": "dicts" | "lists" | "strings" | "ints" | "text"}
                                          # a result frame of about BYTES made of that
    {"sleep": SECONDS} / {"silence": true} / {"close": true}
    {"until_cancel": true}                # wait for the client's cancel (a slow, honest agent)

From a test, :class:`FakeAgent` starts one (a context manager: ``with FakeAgent(spec) as fake``,
then ``fake.pid``, ``fake.received()``). Every message the client sends is appended to RECEIVED (SPEC.json + ".received", JSON lines),
so a test can check that the CLI sent a cancel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from flight_profiler.agent import protocol

_HEADER = struct.Struct(">I")
_SERVED = [0]  # requests served so far, over every connection
_SERVED_LOCK = threading.Lock()


def _frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


def _substitute(value: Any, req_id: Any) -> Any:
    if value == "$id":
        return req_id
    if isinstance(value, dict):
        return {k: _substitute(v, req_id) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, req_id) for v in value]
    return value


def _big_result(size: int, shape: str, req_id: Any) -> bytes:
    head = b'{"type":"result","id":' + json.dumps(req_id).encode() + b',"data":{"junk":['
    tail = b"0]}}"
    if shape == "text":  # one string, beyond Latin-1: four bytes a character once decoded
        emoji = "\U0001f600".encode()
        return _frame(head + b'"' + b"a" * max(0, size - len(head) - len(tail) - 7) + emoji
                      + b'",' + tail)
    unit = {"dicts": b"{},", "lists": b"[],", "strings": b'"ab",', "ints": b"7,"}[shape]
    count = max(0, (size - len(head) - len(tail)) // len(unit))
    return _frame(head + unit * count + tail)


def hello() -> dict[str, Any]:
    return {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "agent_version": "0.1.0",
            "pid": os.getpid(), "start_time": protocol.process_start_time(os.getpid()),
            "python": ".".join(map(str, sys.version_info[:3]))}


class Conversation:
    def __init__(self, conn: socket.socket, spec: dict[str, Any], received: str) -> None:
        self.conn = conn
        self.spec = spec
        self.received = received
        self.requests: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        self.closed = False
        self.cancelled = threading.Event()

    def bytes_of(self, action: dict[str, Any], req_id: Any) -> bytes:
        if "hello" in action:
            return protocol.encode({**hello(), **action["hello"]})
        if "result" in action:
            return protocol.encode({"type": "result", "id": req_id, "data": action["result"]})
        if "event" in action:
            return protocol.encode({"type": "event", "id": req_id, "data": action["event"]})
        if "error" in action:
            return protocol.encode({"type": "error", "id": req_id, "error": action["error"]})
        if "send" in action:
            return _frame(json.dumps(_substitute(action["send"], req_id)).encode())
        if "raw" in action:
            return bytes.fromhex(action["raw"])
        if "header_only" in action:
            return _HEADER.pack(int(action["header_only"]))
        if "big_result" in action:
            return _big_result(int(action["big_result"]), action.get("shape", "dicts"), req_id)
        raise ValueError(f"not a frame action: {action}")

    def perform(self, actions: list[dict[str, Any]], req_id: Any) -> None:
        for action in actions:
            if "sleep" in action:
                time.sleep(float(action["sleep"]))
            elif "silence" in action:
                while not self.closed:
                    time.sleep(0.1)
            elif "until_cancel" in action:
                while not self.cancelled.wait(0.05) and not self.closed:
                    pass
            elif "close" in action:
                self.conn.shutdown(socket.SHUT_RDWR)
                return
            elif "trickle" in action:
                data = self.bytes_of(action["trickle"], req_id)
                pause = 1.0 / float(action.get("rate", 1))
                for i in range(len(data)):
                    self.conn.sendall(data[i:i + 1])
                    time.sleep(pause)
            else:
                self.conn.sendall(self.bytes_of(action, req_id))

    def plan(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        by_cmd = self.spec.get("by_cmd") or {}
        if request.get("cmd") in by_cmd:
            return list(by_cmd[request["cmd"]])
        plans = self.spec.get("requests") or [[{"result": {}}]]
        with _SERVED_LOCK:
            n = _SERVED[0]
            _SERVED[0] += 1
        return list(plans[min(n, len(plans) - 1)])

    def read_loop(self) -> None:
        """Log what the client sends; hand requests to the conversation."""
        try:
            while True:
                message = protocol.recv(self.conn)
                if message is None:
                    break
                with open(self.received, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(message) + "\n")
                if message.get("type") == "cancel":
                    self.cancelled.set()
                if message.get("type") == "request":
                    with self.arrived:
                        self.requests.append(message)
                        self.arrived.notify_all()
        except (OSError, protocol.ProtocolError):
            pass
        finally:
            with self.arrived:
                self.closed = True
                self.arrived.notify_all()

    def run(self) -> None:
        try:
            first = protocol.recv(self.conn)
            if first is None:
                return
            with open(self.received, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(first) + "\n")
            self.perform(self.spec.get("handshake", [{"hello": {}}]), None)
            threading.Thread(target=self.read_loop, daemon=True).start()
            served = 0
            while True:
                with self.arrived:
                    while len(self.requests) <= served and not self.closed:
                        self.arrived.wait()
                    if len(self.requests) <= served:
                        return
                    request = self.requests[served]
                self.perform(self.plan(request), request.get("id"))
                served += 1
        except (OSError, protocol.ProtocolError):
            pass
        finally:
            self.closed = True
            with contextlib.suppress(OSError):
                self.conn.close()


class FakeAgent:
    """A fake agent process for a test: ``with FakeAgent(spec, env=...) as fake: fake.pid``."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str] | None = None) -> None:
        import subprocess
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="fp-fake-agent-")
        self.spec_path = os.path.join(self.dir, "spec.json")
        with open(self.spec_path, "w", encoding="utf-8") as fh:
            json.dump(spec, fh)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.spec_path],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"READY":
            self.stop()
            raise RuntimeError("the fake agent did not start")
        self.pid = self.proc.pid

    def received(self) -> list[dict[str, Any]]:
        """Every message the CLI sent it, in order."""
        try:
            with open(self.spec_path + ".received", encoding="utf-8") as fh:
                return [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        import shutil

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> FakeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _leave(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, _leave)
    spec_path = sys.argv[1]
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    directory = protocol.socket_dir(os.geteuid())
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    path = protocol.socket_path(os.getpid(), os.geteuid())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(16)
    print("READY", flush=True)
    try:
        while True:
            conn, _ = server.accept()
            talk = Conversation(conn, spec, spec_path + ".received")
            threading.Thread(target=talk.run, daemon=True).start()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()


# Forks and execs the CLI, waits for it, writes its peak RSS (KiB) to argv[1], and exits as it
# did; it ignores Ctrl-C itself (the CLI, in the same process group, gets it).
_LAUNCHER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as fh:
    fh.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


class CliRun:
    """What one run of the CLI did: exit status (None: killed at the test's limit), its
    output, how long it took and its peak RSS (wait4)."""

    def __init__(self, returncode: int | None, stdout: str, stderr: str, seconds: float,
                 peak_rss: int) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds
        self.peak_rss = peak_rss

    def __repr__(self) -> str:
        return (f"CliRun(rc={self.returncode}, {self.seconds:.1f}s, {self.peak_rss >> 20} MiB, "
                f"stdout={self.stdout[-800:]!r}, stderr={self.stderr[-800:]!r})")


def run_cli(*args: str, limit: float = 60.0, stdin: str | None = None,
            env: dict[str, str] | None = None,
            interrupt_when: Callable[[], bool] | None = None) -> CliRun:
    """``flight_profiler ARGS`` in a new process (group); killed at ``limit`` seconds.
    ``interrupt_when``: send it SIGINT (Ctrl-C) half a second after this first returns True."""
    import subprocess
    import tempfile

    # FP_TEST_CLI_SRC: run another checkout's CLI (e.g. main's src/, to see a test fail on it)
    other = os.environ.get("FP_TEST_CLI_SRC")
    env = {**(env or {}), **({"PYTHONPATH": other} if other else {})}
    with tempfile.TemporaryDirectory(prefix="fp-cli-run-") as tmp:
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        rss_path = os.path.join(tmp, "rss")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            started = time.monotonic()
            # Through a small launcher: a child forked from this (big) test process would
            # inherit its peak RSS (ru_maxrss survives exec); the CLI is forked from the launcher.
            proc = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, rss_path, "-m", "flight_profiler", *args],
                stdout=out, stderr=err,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                env={**os.environ, **env}, start_new_session=True)
            if stdin is not None:
                assert proc.stdin is not None
                proc.stdin.write(stdin.encode())
                proc.stdin.close()
            returncode: int | None = None
            interrupt_at: float | None = None
            while True:
                code = proc.poll()
                if code is not None:
                    returncode = code
                    break
                if interrupt_when is not None and interrupt_at is None and interrupt_when():
                    interrupt_at = time.monotonic() + 0.5
                if interrupt_at is not None and time.monotonic() >= interrupt_at:
                    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the group
                    interrupt_at = float("inf")
                if time.monotonic() - started > limit:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.02)
            seconds = time.monotonic() - started
        with open(out_path, encoding="utf-8", errors="surrogateescape") as fh:
            stdout = fh.read()
        with open(err_path, encoding="utf-8", errors="surrogateescape") as fh:
            stderr = fh.read()
        try:
            with open(rss_path, encoding="utf-8") as fh:
                rss = int(fh.read()) * 1024
        except (OSError, ValueError):
            rss = 0
    return CliRun(returncode, stdout, stderr, seconds, rss)
