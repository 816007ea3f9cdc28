"""The armed triggers of this process: arm, disarm, the watcher thread, what status shows.

The armory belongs to the process, not to a connection: the CLI that armed it may exit or be
killed and the triggers stay. It is registered once with the agent's state (``add_hook``), so
``detach`` and the agent's shutdown remove everything; ``disarm`` removes it too. The watcher
thread sleeps :data:`TICK_S` between looks (hang, RSS, --for expiry, hooks whose removal had
to wait); it exists only while something is armed and is joined on disarm.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from ..registry import AgentState
from .base import Trigger
from .step_clock import StepClock

log = logging.getLogger("flight_profiler.agent")
TICK_S = 0.2
THREAD_NAME = "flight_profiler-arm"


class Armory:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.triggers: list[tuple[Trigger, float | None]] = []  # (trigger, expiry monotonic)
        self.clock: StepClock | None = None
        self.retired: list[StepClock] = []  # clocks whose hooks could not be removed yet
        self.history: list[dict[str, Any]] = []  # disarmed triggers, for status
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hook_id: int | None = None
        self._state: AgentState | None = None

    # -- arming --------------------------------------------------------------------------------
    def arm(self, trigger: Trigger, state: AgentState, duration: float | None) -> list[str]:
        notes: list[str] = []
        with self.lock:
            if trigger.needs_clock:
                if self.clock is None:
                    clock = StepClock()
                    notes += clock.install()  # raises RuntimeError when it cannot be done safely
                    self.clock = clock
                self.clock.add(trigger)
            trigger.clock = self.clock
            try:
                notes += trigger.install()
            except BaseException:
                if self.clock is not None:
                    self.clock.discard(trigger)
                raise
            expiry = time.monotonic() + duration if duration else None
            self.triggers.append((trigger, expiry))
            if self._hook_id is None or self._state is not state:
                self._state = state
                self._hook_id = state.add_hook("arm: armed triggers (disarm or detach removes them)",
                                               self.disarm_all)
            if self._thread is None or not self._thread.is_alive() or self._stop.is_set():
                # a watcher told to stop may still be finishing: the new one has its own event
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._watch, args=(self._stop,),
                                                name=THREAD_NAME, daemon=True)
                self._thread.start()
        return notes

    # -- disarming -----------------------------------------------------------------------------
    def disarm(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Remove the triggers of ``kind`` (all when None); returns what each left behind."""
        with self.lock:
            chosen = [t for t, _ in self.triggers if kind is None or t.kind == kind]
            self.triggers = [(t, e) for t, e in self.triggers if t not in chosen]
            out = [self._remove(t) for t in chosen]
            empty = not self.triggers
            if empty:
                self._retire_clock()
        if empty:
            self._shutdown()
        return out

    def disarm_all(self) -> None:
        self.disarm(None)

    def _remove(self, trigger: Trigger) -> dict[str, Any]:
        if self.clock is not None:
            self.clock.discard(trigger)
        try:
            left = trigger.remove()
        except Exception as exc:
            left = [f"removal failed: {type(exc).__name__}: {exc}"]
        trigger.state = "disarmed"
        doc = trigger.describe()
        doc["left_behind"] = left
        self.history = [*self.history[-19:], doc]
        trigger.out.close()
        return doc

    def _retire_clock(self) -> None:
        clock, self.clock = self.clock, None
        if clock is not None and not clock.request_removal():
            self.retired.append(clock)

    def _shutdown(self) -> None:
        state, hook_id = self._state, self._hook_id
        self._hook_id = None
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and not self.retired:
            thread.join(timeout=2.0)
            self._thread = None
        if state is not None and hook_id is not None:
            state.remove_hook(hook_id)  # disarm_all again: nothing left, returns at once

    # -- the watcher -----------------------------------------------------------------------------
    def _watch(self, stop: threading.Event) -> None:
        try:
            while True:
                stopping = stop.wait(TICK_S)
                self.retired = [c for c in self.retired if not c.try_remove()]
                if stopping:
                    if not self.retired:
                        return
                    continue
                now = time.monotonic()
                with self.lock:
                    triggers = list(self.triggers)
                for trigger, expiry in triggers:
                    if expiry is not None and now >= expiry:
                        self.disarm_one(trigger)
                        continue
                    try:
                        trigger.tick(now)
                    except Exception:
                        log.exception("arm: %s trigger failed in the watcher", trigger.kind)
                    if trigger.state == "spent" and not trigger.busy():
                        self.disarm_one(trigger)
        except BaseException:  # never reach threading.excepthook (it prints to stderr)
            log.exception("arm: watcher thread failed")

    def disarm_one(self, trigger: Trigger) -> None:
        with self.lock:
            if not any(t is trigger for t, _ in self.triggers):
                return
            self.triggers = [(t, e) for t, e in self.triggers if t is not trigger]
            self._remove(trigger)
            if self.clock is not None and not any(t.needs_clock for t, _ in self.triggers):
                self._retire_clock()
            empty = not self.triggers
        if empty:
            self._shutdown()

    def describe(self) -> dict[str, Any]:
        with self.lock:
            armed = []
            for trigger, expiry in self.triggers:
                doc = trigger.describe()
                doc["expires_in_s"] = round(expiry - time.monotonic(), 1) if expiry else None
                armed.append(doc)
            return {"armed": armed, "disarmed": list(self.history),
                    "step_clock": self.clock.state() if self.clock is not None else None,
                    "hooks_pending_removal": len(self.retired),
                    "watcher": self._thread is not None and self._thread.is_alive()}


ARMORY = Armory()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the lock at the fork: the child's copy would stay
    # taken for ever, and the server's fork hook disarms through it (server._after_fork_in_child).
    ARMORY.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
