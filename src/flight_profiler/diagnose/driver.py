"""How the workflow talks to the target: one request at a time, with a deadline.

The workflow only needs :class:`Driver` (``run(request, on_event, timeout) -> dict``), so unit
tests give it a fake and the real one wraps an attached :class:`flight_profiler.api.Session`.

A phase must give up when the method is not called in time: ``Session.execute`` cancels the
request at its deadline (the agent then removes the request's hooks and answers with what it
has) and the phase is reported as timed out, not failed. If the agent does not answer even
then (the target holds the GIL in native code), the connection is closed after a grace period,
which the agent treats as a cancel too; the next phase reconnects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from flight_profiler.client import RequestTimeout
from flight_profiler.errors import FlightProfilerError

if TYPE_CHECKING:
    from flight_profiler.api import Session
    from flight_profiler.requests import AgentRequest

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
    def run(self, request: AgentRequest, on_event: EventHandler | None = None,
            timeout: float | None = None) -> dict[str, Any]:
        """Run ``request``; raise PhaseTimeout at ``timeout`` seconds."""
        ...


class SessionDriver:
    """A :class:`Driver` over a live session."""

    def __init__(self, session: Session, connect_timeout: float = 10.0) -> None:
        self.session = session
        self.connect_timeout = connect_timeout
        # Whether this diagnosis put the agent there (then it removes it at the end), even if
        # a dropped connection made it reconnect since.
        self.injected = session.injected

    def run(self, request: AgentRequest, on_event: EventHandler | None = None,
            timeout: float | None = None) -> dict[str, Any]:
        if self.session.client is None:
            # An earlier phase dropped a stuck connection; the agent itself is still there.
            from flight_profiler.api import connect

            self.session = connect(self.session.pid, timeout=self.connect_timeout)
        try:
            return self.session.execute(request, on_event, timeout, grace=CANCEL_GRACE_S)
        except RequestTimeout as exc:
            raise PhaseTimeout(exc.message, exc.partial, exc.events) from None
