"""The step, without the user naming a method: torch's global optimizer step post-hook.

``torch.optim.optimizer.register_optimizer_step_post_hook`` (public, torch >= 2.0) runs after
every ``optimizer.step()`` of every optimizer, in the thread that steps: a step boundary and the
training thread's identity for one Python call per step. No pre-step hook: no trigger needs the
step's start, and each hook is a Python call on every step of the job (bench/bench_arm.py). With several
optimizers (a GAN's two), the first one seen defines the step. A method the user names
(``--step module [class] method``) defines it instead when given; its exceptions are seen too.

Installing and removing is where care is needed. torch iterates its hook tables (OrderedDicts)
live, ``for hook in chain(table.values(), ...)``: a key added or removed by another thread while
the training thread is inside that loop (in any hook's Python code) makes its next iteration
raise RuntimeError inside the job's ``optimizer.step()``. So a table is changed only when no
thread is inside an optimizer's step wrapper, or by the training thread itself where it is
provably safe: a hook may delete itself when it is the LAST entry of the table being iterated
(the C OrderedDict iterator has already moved past the end; checked on CPython 3.6-3.13). What cannot be removed
at once (a job that never leaves ``step``) is retried by the watcher; meanwhile the hooks do
nothing. ``state()`` says which.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Protocol

from .. import hooks, targets

log = logging.getLogger("flight_profiler.agent")
_REGISTER_WAIT_S = 2.0


class Listener(Protocol):
    def on_post_step(self, clock: StepClock, optimizer: Any, is_step: bool) -> None: ...

    def on_step_error(self, clock: StepClock, exc: BaseException) -> None: ...


def _optimizer_module() -> Any:
    return sys.modules.get("torch.optim.optimizer")


def thread_in_step(skip: int | None = None) -> bool:
    """Whether any thread (but ``skip``) is inside an optimizer's step wrapper right now."""
    module = _optimizer_module()
    filename = getattr(module, "__file__", None)
    if not filename:
        return False
    frames = sys._current_frames()
    frame: Any = None
    try:
        for ident, top in list(frames.items()):
            if ident == skip:
                continue
            depth = 0
            frame = top
            while frame is not None and depth < 400:
                code = frame.f_code
                if code.co_name == "wrapper" and code.co_filename == filename:
                    return True
                frame = frame.f_back
                depth += 1
        return False
    finally:
        del frames
        frame = None


def _overrides(listener: Any, name: str) -> bool:
    """Whether ``listener`` has its own ``name``, not the Trigger base's no-op."""
    method = getattr(type(listener), name, None)
    return method is not None and getattr(method, "__qualname__", "") != f"Trigger.{name}"


class StepClock:
    """Step count, step period and the stepping thread, for the triggers that listen."""

    def __init__(self, step_spec: dict[str, Any] | None = None) -> None:
        self.lock = threading.Lock()
        self.listeners: tuple[Listener, ...] = ()
        self.post_listeners: tuple[Listener, ...] = ()
        self.steps = 0
        self.last_end: float | None = None  # perf_counter at the end of the last step
        self.last_period: float | None = None
        self.thread: int | None = None  # ident of the thread that steps
        self.thread_native: int | None = None
        self.clock_optimizer: int | None = None
        self.optimizers: set[int] = set()
        self.step_spec = step_spec
        self.step_target: str | None = None
        self._pre_key: int | None = None  # none is installed now; kept for _pop's symmetry
        self._post_key: int | None = None
        self._method_removal: Any = None
        self.closing = False
        self.errors = 0
        # things only the training thread can undo (the NaN locator's dispatch mode): each is
        # tried at every step end until it says done; the hook stays until then
        self.pending: tuple[Callable[[], bool], ...] = ()

    # -- installing ------------------------------------------------------------------------
    def install(self) -> list[str]:
        """Install the hooks; returns notes. Raises RuntimeError when it cannot be done safely."""
        notes: list[str] = []
        if self.step_spec is not None:
            target = targets.resolve(self.step_spec)
            self._method_removal = hooks.install(target, None, self._on_method_exit)
            self.step_target = target.description
            notes.append(f"step = each return of {target.description}")
        module = _optimizer_module()
        post = getattr(module, "register_optimizer_step_post_hook", None)
        if post is None:
            notes.append("this torch has no global optimizer step hooks: gradients are not checked"
                         + ("" if self.step_spec else " and there is no step; name one with --step"))
            return notes
        deadline = time.monotonic() + _REGISTER_WAIT_S
        while thread_in_step():
            if time.monotonic() > deadline:
                self.remove_method_hook()
                raise RuntimeError("a thread stayed inside optimizer.step() for "
                                   f"{_REGISTER_WAIT_S:g} s: its hook tables cannot be changed safely now")
            time.sleep(0.005)
        self._post_key = post(self._on_post).id
        if self.step_spec is None:
            notes.append("step = each optimizer.step() (torch's global optimizer step hooks)")
        return notes

    def add(self, listener: Listener) -> None:
        with self.lock:
            self._set((*self.listeners, listener))

    def discard(self, listener: Listener) -> None:
        with self.lock:
            self._set(tuple(x for x in self.listeners if x is not listener))

    def _set(self, listeners: tuple[Listener, ...]) -> None:
        self.listeners = listeners
        # each optimizer.step() calls only the listeners with something to do there (hang
        # reads the step count from the watcher: it has none)
        self.post_listeners = tuple(x for x in listeners if _overrides(x, "on_post_step"))

    # -- the hooks (the training thread) ---------------------------------------------------
    def _on_post(self, optimizer: Any, args: Any, kwargs: Mapping[str, Any]) -> None:
        if self.pending:
            self._run_pending()
        if self.closing:
            if not self.pending:
                self._remove_from_hook()
            return
        key = id(optimizer)
        is_step = key == self.clock_optimizer
        if not is_step:  # the clock's own optimizer is known already: nothing to add per step
            self.optimizers.add(key)
            if self.clock_optimizer is None and self.step_spec is None:
                self.clock_optimizer = key
                is_step = True
        if is_step:
            self._tick()
        for listener in self.post_listeners:
            try:
                listener.on_post_step(self, optimizer, is_step)
            except Exception:
                self._failed(listener)

    def _on_method_exit(self, token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if self.closing:
            return
        self._tick()
        for listener in self.listeners:
            try:
                if exc is not None:
                    listener.on_step_error(self, exc)
                listener.on_post_step(self, None, True)
            except Exception:
                self._failed(listener)

    def _tick(self) -> None:
        # Every optimizer.step() of the job pays for this: one clock read and one C call for
        # the thread; the wall time and the native id are derived when asked (bench_arm.py).
        now = time.perf_counter()
        if self.last_end is not None:
            self.last_period = now - self.last_end
        self.last_end = now
        self.steps += 1
        ident = threading.get_ident()
        if ident != self.thread:
            self.thread = ident
            self.thread_native = getattr(threading.current_thread(), "native_id", None)

    def defer(self, undo: Callable[[], bool]) -> None:
        """``undo`` runs in the stepping thread at each step end until it returns True."""
        with self.lock:
            self.pending = (*self.pending, undo)

    def _run_pending(self) -> None:
        done = []
        for undo in self.pending:
            try:
                if undo():
                    done.append(undo)
            except Exception:
                log.exception("arm: undoing in the training thread failed")
                done.append(undo)  # it will not do better next time
        if done:
            with self.lock:
                self.pending = tuple(u for u in self.pending if u not in done)

    @property
    def last_step_wall(self) -> float | None:
        """time.time() at the end of the last step (from its perf_counter reading)."""
        if self.last_end is None:
            return None
        return time.time() - (time.perf_counter() - self.last_end)

    def _failed(self, listener: Any) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.exception("arm: a trigger failed in the step hook (%s)", type(listener).__name__)

    # -- removing --------------------------------------------------------------------------
    def request_removal(self) -> bool:
        """Stop listening; remove every hook now if that is safe. True when all are gone."""
        self.closing = True
        with self.lock:
            self._set(())
        self.remove_method_hook()
        return self.try_remove()

    def remove_method_hook(self) -> None:
        removal, self._method_removal = self._method_removal, None
        if removal is not None:
            removal()

    def try_remove(self) -> bool:
        """From any thread: remove the table entries if no thread is inside a step now."""
        if self.removed():
            return True
        if self.pending or thread_in_step():
            return False
        self._pop(pre=True)
        self._pop(pre=False)
        return self.removed()

    def removed(self) -> bool:
        return (self._pre_key is None and self._post_key is None and self._method_removal is None
                and not self.pending)

    def _remove_from_hook(self) -> None:
        """In the training thread, inside torch's loop over the post table (see the module doc)."""
        if thread_in_step(skip=threading.get_ident()):
            return  # another thread steps too: leave it to the watcher
        if self._is_last(pre=False):
            self._pop(pre=False)

    def _table(self, pre: bool) -> Any:
        module = _optimizer_module()
        name = "_global_optimizer_pre_hooks" if pre else "_global_optimizer_post_hooks"
        return getattr(module, name, None)

    def _is_last(self, pre: bool) -> bool:
        table, key = self._table(pre), self._pre_key if pre else self._post_key
        if key is None or table is None or type(table).__name__ != "OrderedDict" or not table:
            return False
        try:
            return bool(next(reversed(table)) == key)
        except (RuntimeError, StopIteration, TypeError):
            return False

    def _pop(self, pre: bool) -> None:
        key = self._pre_key if pre else self._post_key
        if key is None:
            return
        table = self._table(pre)
        if table is not None:
            table.pop(key, None)  # one C call: atomic under the GIL
        if pre:
            self._pre_key = None
        else:
            self._post_key = None

    def state(self) -> dict[str, Any]:
        return {"steps": self.steps, "optimizers": len(self.optimizers),
                "step": self.step_target or "optimizer.step()",
                "last_period_s": round(self.last_period, 6) if self.last_period else None,
                "hooks": "removed" if self.removed() else (
                    "removal pending: the NaN locator's op watch leaves the training thread at its "
                    "next step" if self.closing and self.pending else
                    "removal pending: a thread is inside optimizer.step()" if self.closing else "on")}
