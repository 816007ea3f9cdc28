"""What every diagnose phase shares: the :class:`Run` (driver, options, progress and what
earlier phases learnt), and how a phase says it cannot run (:class:`Skip`).

Kept apart from workflow.py (the phases and their order) so that phase modules such as
training.py import it without importing the workflow that imports them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from flight_profiler.diagnose.driver import Driver
from flight_profiler.diagnose.model import DiagnoseOptions, PhaseResult
from flight_profiler.diagnose.preload import Preloader
from flight_profiler.diagnose.progress import Progress
from flight_profiler.errors import FlightProfilerError
from flight_profiler.requests import AgentRequest

# The driver cancels a command this long after the limit the command itself was given.
BACKSTOP_S = 15.0
# Events a phase keeps for its summary (--calls is at most 10,000, one event per call): an agent
# that streams more cannot grow the diagnosis without bound (the rest are counted, not kept).
MAX_KEPT_EVENTS = 20_000
# A call at least this long is costly to record or trace (see Run.calls_for).
HEAVY_CALL_MS = 50.0
# The watch, the trace and the gradients take no more of the method's calls than its period
# fits in this many seconds (Run.calls_within), CALLS_LEAST at least: a forward of a few ms
# in a step of 220 ms (a language model whose hidden state is never detached) made 10 watched
# and 10 traced calls 4.5 s of a 10.7 s diagnosis, and 5 LBFGS steps of 150-230 ms made the
# watch 0.9-1.3 s of 10-11 s. The spread of a cost, where the time goes and a gradient's trend
# show in 3 calls (the least every costly method already gets).
CALLS_WINDOW_S = 0.6
CALLS_LEAST = 3
# A trace's call tree is the same from one call to the next (where the time goes is a share of
# each), so it takes 2 where the period is long: a third traced LBFGS step of a style transfer
# (0.3-0.4 s) added nothing to the tree and a tenth to the diagnosis.
TRACE_CALLS_LEAST = 2


def calls_seen(event: dict[str, Any], seen: int) -> int:
    """Calls observed so far, from a streamed event (watch/trace: one per call; torch commands:
    progress events carrying ``calls_done``)."""
    done = event.get("calls_done")
    if isinstance(done, int) and not isinstance(done, bool):
        return done
    if event.get("type") in ("call", "trace"):
        return seen + 1
    return seen


class Skip(Exception):
    """The phase cannot run here; the message says why (shown as the reason)."""


class TargetUnusable(Exception):
    """The method cannot be hooked at all (typo, not found): the diagnosis stops here."""

    def __init__(self, error: FlightProfilerError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class Run:
    """What the phases share: the driver, options, progress and what earlier phases learnt."""

    driver: Driver
    options: DiagnoseOptions
    progress: Progress
    torch_imported: bool | None = None
    torch_missing: str = "the target has not imported torch"
    cuda: bool | None = None
    method_called: bool | None = None  # None: no method given or not checked yet
    not_called: str = ""  # why the method is taken as not called (the locate phase's words)
    census_before_at: float = 0.0
    watch_loop: dict[str, Any] | None = None  # the method's share of its loop (watch phase)
    first_call_ms: float | None = None  # the cost of the call the locate phase saw
    # Seconds from one call of the method to the next, as far as known: at least the first
    # call's cost, then the profile window's calls (under the profiler, so long rather than
    # short), then the watch's own measure of the loop.
    call_period_s: float | None = None
    # Without a method: the optimizer's step the profile window found (`module class step`, the
    # optimizer that stepped least: a GAN's generator, accumulation's real step), and its rate.
    window_step: list[str] | None = None
    window_steps_per_s: float | None = None
    artefacts: list[str] = field(default_factory=list)  # written by the phases so far
    preloader: Preloader = field(default_factory=Preloader)  # the report's inputs, ahead of it

    def calls_for(self, heavy_cap: int) -> int:
        """Calls a costly phase observes: ``--calls``, or at most ``heavy_cap`` when one call
        of the method takes long (a whole LBFGS step: recording or tracing each of them costs
        seconds and tens of MB)."""
        calls = self.options.calls
        if self.first_call_ms is not None and self.first_call_ms >= HEAVY_CALL_MS:
            return min(calls, heavy_cap)
        return calls

    def calls_within(self, calls: int, least: int = CALLS_LEAST) -> int:
        """``calls``, but no more than the method's period fits in CALLS_WINDOW_S (``least``
        at least, never more than ``calls``)."""
        period = self.call_period_s
        if period is None or period <= 0:
            return calls
        return min(calls, max(least, int(CALLS_WINDOW_S / period)))

    def path(self, name: str) -> str:
        """An artefact's path (the request's line quotes it if it needs quoting)."""
        return os.path.join(self.options.out_dir, name)

    def words(self) -> list[str]:
        """The method as the commands take it: ``module [class] method``."""
        assert self.options.target is not None
        return self.options.target.words.split()

    def command(self, phase: PhaseResult, request: AgentRequest, timeout: float | None = None,
                expect_calls: int | None = None) -> dict[str, Any]:
        """Run ``request`` for ``phase``, showing what it waits for.

        Commands that wait for calls get ``--timeout`` themselves (the agent then stops cleanly
        and says how many calls it saw); the driver's own deadline is only a backstop for an
        agent that does not answer at all.
        """
        phase.command = request.line
        target = self.options.target
        seen = [0]
        if expect_calls and target is not None:
            self.progress.waiting(f"waiting for {target.label} to be called: 0 of {expect_calls} calls")

        def on_event(data: dict[str, Any]) -> None:
            seen[0] = calls_seen(data, seen[0])
            kept = phase.data.setdefault("events", [])
            if len(kept) < MAX_KEPT_EVENTS:
                kept.append(data)
            else:
                phase.data["events_not_kept"] = phase.data.get("events_not_kept", 0) + 1
            if expect_calls and target is not None:
                if seen[0] >= expect_calls:
                    self.progress.waiting(f"{expect_calls} of {expect_calls} calls seen; the "
                                          "agent is finishing (writing its files)")
                else:
                    self.progress.waiting(f"waiting for {target.label} to be called: "
                                          f"{seen[0]} of {expect_calls} calls")

        limit = self.options.timeout if timeout is None else timeout
        return self.driver.run(request, on_event, limit + BACKSTOP_S)

    def require_torch(self) -> None:
        if self.torch_imported is False:
            raise Skip(self.torch_missing)

    def require_method(self) -> None:
        if self.options.target is None:
            raise Skip("no method given (pass `module [class] method` to observe its calls)")
        if self.method_called is False:
            raise Skip(self.not_called or f"{self.options.target.label} was not called within "
                                          f"{self.options.timeout:g}s")


def expect_file(phase: PhaseResult, path: str) -> None:
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        raise FlightProfilerError(f"the agent reported success but {path} is missing or empty")
    phase.files.append(path)
