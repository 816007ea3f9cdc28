"""Public Python API; the CLI is built on it.

```python
from flight_profiler import requests
from flight_profiler.api import connect
with connect(pid, timeout=10.0) as session:      # attaches (injects if no agent answers)
    info = session.request("status")              # structured: handler name + args
    stacks = session.run("stack")                 # a command line, parsed as the CLI does
    req = requests.hooks.watch(["__main__", "train_step"], count=3)   # a typed builder
    result = session.execute(req, on_event=print, timeout=60)  # cancelled at the deadline
    for event in session.stream("watch", {...}):  # streaming commands, as a generator
        ...
    session.detach()
```

``connect`` reuses a running agent when one answers (a reconnect costs a few milliseconds) and
injects only when none does. Leaving the ``with`` block closes the connection; the agent stays
(cheap when idle) until ``detach()``.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import time
from collections.abc import Generator, Iterator

from flight_profiler import answers
from flight_profiler.agent import protocol
from flight_profiler.attach.agent_dir import AgentDir
from flight_profiler.client import (
    CANCEL_GRACE,
    AgentBusy,
    AgentClient,
    NoAgent,
    RequestInterrupted,
    RequestTimeout,
)
from flight_profiler.errors import (
    AgentLost,
    AttachFailed,
    AttachTimeout,
    FlightProfilerError,
)
from flight_profiler.requests import AgentRequest, deadlines
from flight_profiler.safe_text import safe_text

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)

if TYPE_CHECKING:
    from typing import Any, Callable

    from flight_profiler.attach.inject import Injection
    from flight_profiler.attach.process import TargetInfo
    from flight_profiler.client import EventHandler

__all__ = ["AgentRequest", "NotAttached", "RequestInterrupted", "RequestTimeout", "Session", "connect"]

_POLL = 0.002  # seconds between connection attempts while the agent starts (each costs ~20 us)


class Session:
    """A connection to the agent in one process."""

    def __init__(self, pid: int, client: AgentClient, injected: bool, attach_seconds: float,
                 method: str | None = None,
                 last_words: Callable[[], str | None] | None = None) -> None:
        self.pid = pid
        # when the connection is lost: what the target wrote while the agent held its stderr,
        # if it died meanwhile (attach/last_words.py)
        self._last_words = last_words
        self.client: AgentClient | None = client
        self.injected = injected  # True when this connect() put the agent there
        self.attach_seconds = attach_seconds
        self.method = method
        self.hello = client.hello

    # -- requests ----------------------------------------------------------------------------
    def _client(self) -> AgentClient:
        if self.client is None:
            raise AgentLost("this session is closed", "connect again")
        return self.client

    def execute(self, request: AgentRequest, on_event: EventHandler | None = None,
                timeout: float | None = None, on_cancel: Callable[[], None] | None = None,
                grace: float = CANCEL_GRACE) -> dict[str, Any]:
        """Run ``request`` (from a builder of :mod:`flight_profiler.requests`, or ``parse``) and
        return its result data, calling ``on_event`` per streamed event.

        ``timeout``: seconds (wall clock) before the request is cancelled; None: its own time
        limit plus a margin (:mod:`flight_profiler.requests.deadlines`; a stream with no limit
        of its own then runs until stopped); ``math.inf``: no deadline. At the deadline the
        request is cancelled (the agent removes its hooks) and :class:`RequestTimeout` carries
        the partial result; Ctrl-C cancels it the same way and raises
        :class:`RequestInterrupted` (a KeyboardInterrupt) with the final result. Every event
        and result is checked against the handler's answer shape first (:mod:`answers`): a
        malformed one raises :class:`errors.BadAnswer`. A lost connection, or a detach, closes
        the session.
        """
        client = self._client()
        if timeout is None:
            timeout = deadlines.deadline(request)
        elif math.isinf(timeout):
            timeout = None
        cmd = request.cmd

        def checked(data: dict[str, Any]) -> None:
            answers.check_event(cmd, data)
            if on_event is not None:
                on_event(data)

        try:
            try:
                result = client.execute(cmd, request.args, checked, timeout, on_cancel, grace)
            except RequestTimeout as exc:
                if exc.partial is not None:
                    answers.check_result(cmd, exc.partial)
                raise
            except RequestInterrupted as exc:
                if exc.result is not None:
                    answers.check_result(cmd, exc.result)
                raise
            answers.check_result(cmd, result)
        except (FlightProfilerError, RequestInterrupted) as exc:
            if request.cmd == "detach" or client.closed:
                self.close()
            if isinstance(exc, AgentLost) and self._last_words is not None:
                words = self._last_words()
                if words:
                    raise AgentLost(f"{exc.message}; {words}", exc.hint) from exc
            raise
        if request.cmd == "detach":
            self.close()
        return result

    def request(self, cmd: str, args: dict[str, Any] | None = None,
                on_event: EventHandler | None = None) -> dict[str, Any]:
        """Run the agent handler ``cmd`` with JSON ``args``; returns its result data."""
        # no command line: raw args need not be expressible in the grammar
        return self.execute(AgentRequest(cmd, dict(args or {})), on_event)

    def run(self, command_line: str, on_event: EventHandler | None = None) -> dict[str, Any]:
        """Parse ``command_line`` exactly as the CLI does (e.g. ``"stack --all"``) and run it."""
        from flight_profiler.requests import parse

        return self.execute(parse(command_line), on_event)

    def stream(self, cmd: str | AgentRequest,
               args: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Yield the events of a streaming command (a handler name and its args, or a built
        request). Leaving the loop early cancels the request (the agent removes its hooks); the
        final result is then in ``self.last_result``."""
        if isinstance(cmd, AgentRequest):
            return self._stream(cmd.cmd, cmd.args)
        return self._stream(cmd, args)

    def _stream(self, cmd: str, args: dict[str, Any] | None) -> Generator[dict[str, Any], None, None]:
        client = self._client()
        req_id = client.start(cmd, args)
        self.last_result: dict[str, Any] | None = None
        finished = False
        try:
            for kind, data in client.messages(req_id):
                if kind == "event":
                    answers.check_event(cmd, data)
                    yield data
                else:
                    answers.check_result(cmd, data)
                    self.last_result = data
                    finished = True
                    return
        finally:
            if not finished and not client.closed:
                last, _ = client.cancel_and_drain(req_id)
                self.last_result = last if last is None or _valid_result(cmd, last) else None
            if client.closed:
                self.close()

    def detach(self) -> dict[str, Any]:
        """Remove every hook, stop the agent and close the connection."""
        if self.client is None:
            return {"detached": False}
        return self.request("detach")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _say_nothing(_: str) -> None:
    pass


def _stderr_say(text: str) -> None:
    # what it says may quote the target (its agent log's last line, a hello's fields)
    sys.stderr.write(f"[attach] {safe_text(text)}\n")
    sys.stderr.flush()


def connect(pid: int, timeout: float = 10.0, method: str = "auto", verbose: bool = False,
            say: Callable[[str], None] | None = None, inject: bool = True) -> Session:
    """Attach to ``pid`` (reusing its agent if one answers) and return a :class:`Session`.

    ``inject=False``: only reuse a running agent; raise :class:`NotAttached` if none answers.
    """
    from flight_profiler.attach import process

    say = say or (_stderr_say if verbose else _say_nothing)
    started = time.monotonic()
    target = process.inspect(pid, check_permissions=False)
    if os.geteuid() not in (0, target.home):
        process.check_permissions(pid)  # names the uid, before the directory refuses us
    with AgentDir.open(target.home, target.root) as directory:
        where = _Where(target, directory)
        try:
            client = where.connect(timeout)
            elapsed = time.monotonic() - started
            say(f"reused the agent already running in {pid} ({elapsed * 1000:.0f} ms)")
            return Session(pid, client, False, elapsed, last_words=where.last_words())
        except AgentBusy as exc:
            raise AttachTimeout(
                f"the agent in process {pid} is running but did not answer: {exc}",
                "a thread of the target is probably holding the GIL in a long C call; retry "
                "later or raise --timeout") from None
        except NoAgent as exc:
            if not inject:
                raise NotAttached(
                    f"no agent answers in process {pid} ({exc})",
                    f"none is attached; if one runs but its socket was removed, any command "
                    f"(`flight_profiler {pid} --cmd status`) gives it a new one") from None
            say(f"no agent answers at {where.display} ({exc}); injecting")
        process.check_permissions(pid)
        lock = protocol.lock_name(target.ns_pid, target.pid_ns)
        with directory.lock(lock, time.monotonic() + timeout, f"process {pid}"):
            from flight_profiler.attach import cleanup  # only on the way to an injection

            for name in cleanup.sweep(directory, where.sock):
                say(f"removed {name} (left by a process that has exited)")
            # another CLI may have attached while we waited for the lock
            try:
                client = where.connect(timeout)
                elapsed = time.monotonic() - started
                say(f"another attach put the agent there meanwhile ({elapsed:.2f}s)")
                return Session(pid, client, False, elapsed, last_words=where.last_words())
            except (NoAgent, AgentBusy):
                pass
            process.check_injectable(pid)
            return _inject_and_connect(target, where, timeout, method, say, started)


def _valid_result(cmd: str, data: dict[str, Any]) -> bool:
    try:
        answers.check_result(cmd, data)
    except FlightProfilerError:
        return False
    return True


class NotAttached(AttachFailed):
    """No agent answers in the process and the caller asked not to inject one."""


class _Where:
    """The target's files in its private directory, reached through its descriptor."""

    def __init__(self, target: TargetInfo, directory: AgentDir) -> None:
        self.target = target
        self.directory = directory
        self.sock = protocol.socket_name(target.ns_pid, target.pid_ns)
        self.log = protocol.log_name(target.ns_pid, target.pid_ns)
        self.display = os.path.join(directory.path, self.sock)
        self.log_display = os.path.join(directory.path, self.log)

    def connect(self, timeout: float) -> AgentClient:
        t = self.target
        # the listener carries the effective uid the job had when it bound: any of its uids
        return AgentClient.connect(self.directory.via_fd(self.sock), t.ns_pid, t.start_time,
                                   timeout=timeout, peer=(t.pid, *(t.uids or (t.uid,))))

    def last_words(self) -> Callable[[], str | None]:
        from flight_profiler.attach import last_words

        t = self.target
        return last_words.finder(t.pid, t.home, t.root, self.log)

    def log_size(self) -> int:
        return self.directory.size(self.log)

    def bootstrap_failure(self, offset: int) -> str | None:
        """The bootstrap's error line written since ``offset`` in the agent log, if any."""
        text = self.directory.read_from(self.log, offset).decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.startswith("bootstrap failed")]
        return lines[-1] if lines else None


def _inject_and_connect(target: TargetInfo, where: _Where, timeout: float, method: str,
                        say: Callable[[str], None], started: float) -> Session:
    pid = target.pid
    say(f"target: pid {pid}, Python {target.version_str}, uid {target.uid}, exe {target.exe}, "
        f"{'libpython ' + target.libpython if target.libpython else 'static interpreter'}")
    from flight_profiler.attach import inject

    deadline = time.time() + timeout
    log_offset = where.log_size()
    injection = inject.inject(target, method, deadline, say)
    client = _wait_for_agent(target, where, deadline, injection, say, log_offset)
    elapsed = time.monotonic() - started
    say(f"agent answered after {elapsed:.2f}s")
    return Session(pid, client, True, elapsed, injection.method, last_words=where.last_words())


def _wait_for_agent(target: TargetInfo, where: _Where, deadline: float, injection: Injection,
                    say: Callable[[str], None], log_offset: int) -> AgentClient:
    # A little grace after the deadline: the bootstrap checks the deadline when it starts,
    # so an agent that started just in time still gets found.
    last: Exception | None = None
    next_log_check = time.time() + 0.1
    while time.time() < deadline + 0.5:
        try:
            return where.connect(max(deadline + 0.5 - time.time(), 0.1))
        except (NoAgent, AgentBusy) as exc:
            last = exc
        if not os.path.exists(f"/proc/{target.pid}"):
            raise AgentLost(f"process {target.pid} exited while the agent was starting",
                            "see the target's own output for why it ended")
        if time.time() >= next_log_check:  # fail fast when the bootstrap reported an error
            next_log_check = time.time() + 0.1
            failure = where.bootstrap_failure(log_offset)
            if failure:
                raise AttachFailed(f"the agent failed to start in {target.pid}: {failure}",
                                   f"see {where.log_display}")
        time.sleep(_POLL)
    failure = where.bootstrap_failure(log_offset)
    if failure:
        raise AttachFailed(f"the agent failed to start in {target.pid}: {failure}",
                           f"see {where.log_display}")
    say(f"last connection attempt: {last}")
    raise AttachTimeout(_explain_timeout(target.pid, injection),
                        "the target was left as it was (the queued bootstrap does nothing once "
                        "this attach has given up); retry later or raise --timeout")


def _thread_state(pid: int, tid: str | None, samples: int = 20, every: float = 0.005) -> str:
    """What the agent's native thread is doing, read from /proc (not guessed).

    One read is a coin toss: a thread waiting for the GIL wakes every switch interval (5 ms) and
    is runnable whenever the scheduler has not got to it, so the state is sampled for 0.1 s and
    the answer says how often each was seen.
    """
    if tid is None:
        return "was not identified (waiting for the GIL, which another thread holds?)"
    task = f"/proc/{pid}/task/{tid}"
    seen: collections.Counter[str] = collections.Counter()
    for i in range(samples):
        try:
            with open(f"{task}/stat") as fh:
                stat = fh.read()
            with open(f"{task}/wchan") as fh:
                wchan = fh.read().strip()
        except OSError:
            if not seen:
                return f"(tid {tid}) has ended without starting the agent"
            break
        state = stat[stat.rindex(")") + 2:].split()[0]
        what = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O"}.get(
            state, f"in state {state}")
        seen[f"{what} in {wchan}" if state != "R" and wchan not in ("", "0") else what] += 1
        if i + 1 < samples:
            time.sleep(every)
    total = sum(seen.values())
    (top, count), *rest = seen.most_common()
    also = "".join(f", {what} {n}" for what, n in rest)
    gil = (" (a futex: most likely waiting for the GIL, which another thread holds)"
           if any("futex" in what for what in seen) else "")
    return f"(tid {tid}) is {top} ({count} of {total} samples over {total * every:.2f} s{also}){gil}"


def _explain_timeout(pid: int, injection: Injection) -> str:
    """Say why the agent did not come up, as precisely as the injector's observations allow."""
    base = f"the agent did not come up in process {pid} in time"
    outcome = injection.evidence
    if outcome is None:
        return f"{base} ({injection.method}: {injection.detail})"
    state = outcome.main_thread_state()
    if outcome.helper_error and outcome.method == "pending":
        return (f"{base}: {outcome.helper_error}, and the pending call queued instead was not "
                f"run (main thread {state})")
    if outcome.method == "thread":
        seen = _thread_state(pid, outcome.values.get("agent_tid"))
        return (f"{base}: the thread started for it {seen}; main thread {state}")
    if outcome.syscall is not None and outcome.syscall < 0 and outcome.holds_gil is False:
        return (f"{base}: the main thread is in native code without the GIL; the agent runs "
                "only when Python code runs again")
    if outcome.syscall is not None and outcome.syscall >= 0 and outcome.holds_gil:
        return (f"{base}: the main thread is blocked in system call {outcome.syscall} while "
                "holding the GIL")
    if outcome.syscall is not None and outcome.syscall >= 0:
        return (f"{base}: the main thread sleeps in system call {outcome.syscall} and no native "
                "thread could be started, so the agent waits for Python code to run")
    return f"{base}: a pending call was queued but no thread ran Python code (main thread {state})"
