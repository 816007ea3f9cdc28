"""How the workflow talks to the target: one command line at a time, with a deadline.

The workflow only needs :class:`Driver` (``run(line, on_event, timeout) -> dict``), so unit tests
give it a fake and the real one wraps an attached :class:`flight_profiler.api.Session`.

Why not ``Session.run``: a phase must give up when the method is not called in time. Here a
timer sends ``cancel`` for the request at its deadline; the agent then removes the request's
hooks and answers with what it has, and the phase is reported as timed out, not failed. If the
agent does not answer even then (the target holds the GIL in native code), the connection is
closed after a grace period, which the agent treats as a cancel too.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from flight_profiler.errors import AgentLost, FlightProfilerError

if TYPE_CHECKING:
    from flight_profiler.api import Session

EventHandler = Callable[[dict[str, Any]], None]

# After a cancel, how long the agent gets to remove its hooks and send its final answer.
CANCEL_GRACE_S = 5.0


class PhaseTimeout(FlightProfilerError):
    """The command was cancelled at its deadline; ``partial`` is what the agent sent back."""

    kind = "phase_timeout"

    def __init__(self, message: str, partial: dict[str, Any] | None = None,
                 events: int = 0) -> None:
        super().__init__(message, "raise --timeout, or check that the method is being called")
        self.partial = partial
        self.events = events


class Driver(Protocol):
    def run(self, line: str, on_event: EventHandler | None = None,
            timeout: float | None = None) -> dict[str, Any]:
        """Run ``line`` as typed after ``--cmd``; raise PhaseTimeout at ``timeout`` seconds."""
        ...


class SessionDriver:
    """A :class:`Driver` over a live session."""

    def __init__(self, session: Session, connect_timeout: float = 10.0) -> None:
        self.session = session
        self.connect_timeout = connect_timeout
        # Whether this diagnosis put the agent there (then it removes it at the end), even if
        # a dropped connection made it reconnect since.
        self.injected = bool(getattr(session, "injected", False))

    def _client(self) -> Any:
        if self.session.client is None:
            # An earlier phase dropped a stuck connection; the agent itself is still there.
            from flight_profiler.api import connect

            self.session = connect(self.session.pid, timeout=self.connect_timeout)
        return self.session._client()

    def run(self, line: str, on_event: EventHandler | None = None,
            timeout: float | None = None) -> dict[str, Any]:
        from flight_profiler.cli.agent_commands import parse

        request = parse(line)
        client = self._client()
        req_id = client.start(request.cmd, request.args)
        fired = threading.Event()
        events = 0

        def cancel() -> None:
            fired.set()
            client.cancel(req_id)

        def give_up() -> None:
            # The agent did not answer the cancel: drop the connection (the agent cancels the
            # request and removes its hooks on disconnect).
            client.close()

        timers = []
        if timeout is not None:
            timers = [threading.Timer(timeout, cancel),
                      threading.Timer(timeout + CANCEL_GRACE_S, give_up)]
            for t in timers:
                t.daemon = True
                t.start()
        result: dict[str, Any] | None = None
        try:
            for kind, data in client.messages(req_id):
                if kind == "event":
                    events += 1
                    if on_event is not None:
                        on_event(data)
                else:
                    result = data
        except KeyboardInterrupt:
            # Ctrl-C: the agent removes this request's hooks before the CLI goes away.
            client.cancel(req_id)
            with contextlib.suppress(FlightProfilerError, KeyboardInterrupt):
                client.drain(req_id, CANCEL_GRACE_S)
            raise
        except FlightProfilerError as exc:
            if fired.is_set():
                lost = isinstance(exc, AgentLost)
                if lost:
                    self.session.close()
                raise PhaseTimeout(
                    f"no answer within {timeout:g}s" + (" (connection dropped)" if lost else ""),
                    None, events) from None
            if isinstance(exc, AgentLost):
                self.session.close()
            raise
        finally:
            for t in timers:
                t.cancel()
        if fired.is_set():
            raise PhaseTimeout(f"cancelled after {timeout:g}s", result, events)
        return result or {}
