"""What every trigger shares: its fire count, its events, one fire at a time, and writing an
event directory whatever goes wrong while capturing (a partial capture says what is missing)."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .evidence import Event, EvidenceDir

if TYPE_CHECKING:
    from .step_clock import StepClock

log = logging.getLogger("flight_profiler.agent")


class Trigger:
    kind = ""
    needs_clock = False

    def __init__(self, out: EvidenceDir, max_fires: int, rank: dict[str, Any]) -> None:
        self.out = out
        self.max_fires = max_fires
        self.rank = rank
        self.fires = 0
        self.dropped = 0
        self.events: list[str] = []
        self.errors: list[str] = []
        self.state = "armed"  # armed | firing | spent | disarmed
        self.clock: StepClock | None = None
        self.armed_at = time.time()
        self._firing = threading.Lock()

    # -- lifecycle (overridden where a trigger installs something) --------------------------
    def install(self) -> list[str]:
        return []

    def remove(self) -> list[str]:
        """Undo what install() did; returns what could not be put back exactly."""
        return []

    def tick(self, now: float) -> None:
        """Called by the watcher thread about once a second."""

    # -- step listener (the training thread) -----------------------------------------------
    def on_post_step(self, clock: StepClock, optimizer: Any, is_step: bool) -> None:
        pass

    def on_step_error(self, clock: StepClock, exc: BaseException) -> None:
        pass

    # -- firing ------------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.state == "armed"

    def begin_fire(self) -> bool:
        """Take the right to fire now (never waits: a second event during a write is skipped)."""
        if self.state != "armed" or not self._firing.acquire(blocking=False):
            return False
        self.state = "firing"
        return True

    def end_fire(self) -> None:
        self.fires += 1
        if self.state == "firing":
            self.state = "spent" if self.fires >= self.max_fires else "armed"
        self._firing.release()
        if self.state == "spent":
            self.on_spent()

    def busy(self) -> bool:
        """Still finishing an event after its last fire (the watcher waits before disarming)."""
        return False

    def on_spent(self) -> None:
        """The last allowed fire is done: stop paying for the watch (subclasses)."""

    def write_event(self, capture: Callable[[Event], dict[str, Any]]) -> str | None:
        """One event directory: ``capture(event)`` writes its files and returns the event's
        fields; any failure inside it is recorded in the event, which is still written."""
        try:
            event = self.out.begin(self.kind, self.rank.get("rank"))
        except OSError as exc:
            self._error(f"cannot start an event directory: {exc}")
            self.dropped += 1
            return None
        doc: dict[str, Any]
        try:
            doc = capture(event)
        except MemoryError:
            doc = {"capture_error": "out of memory while capturing"}
        except Exception as exc:
            log.exception("arm: capturing %s evidence failed", self.kind)
            doc = {"capture_error": f"{type(exc).__name__}: {exc}"}
        base = {"trigger": self.kind, "time": time.time(), "pid": os.getpid(),
                "armed_at": self.armed_at, "fire": self.fires + 1, "max_fires": self.max_fires,
                "rank": self.rank, "params": self.params(),
                "step": self.clock.steps if self.clock is not None else None}
        try:
            final = event.commit({**base, **doc})
        except Exception as exc:
            self._error(f"cannot write the event: {exc}")
            self.dropped += 1
            return None
        if final is None:
            self.dropped += 1
            self._error(f"disk cap of {self.out.cap} bytes reached in {self.out.path}: event dropped")
            return None
        self.events.append(final)
        log.info("arm: %s fired, evidence in %s", self.kind, os.path.join(self.out.path, final))
        return final

    def _error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)
        log.warning("arm: %s: %s", self.kind, text)

    def params(self) -> dict[str, Any]:
        return {}

    def detail(self) -> dict[str, Any]:
        """What the trigger sees now (status)."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "state": self.state, "params": self.params(),
                "fires": self.fires, "max_fires": self.max_fires, "dropped": self.dropped,
                "events": [os.path.join(self.out.path, e) for e in self.events],
                "errors": list(self.errors), **self.detail()}
