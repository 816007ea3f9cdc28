"""The handler table, the per-request context, and the agent-wide instrumentation list.

A handler is ``def handle(ctx: Context) -> dict``: it reads ``ctx.args`` (plain JSON data the
CLI built), may stream with ``ctx.emit(data)``, must stop when ``ctx.cancelled`` turns true,
and returns the final JSON-able result. User errors are raised as :class:`CommandError`.
Anything else that escapes is reported to the client as an internal error and logged; it never
reaches the target's own threads.

Hooks a handler installs in the target are registered with ``ctx.add_hook(description, remove)``:
``remove`` then runs when the request ends in any way (limit reached, timeout, cancel, client
disconnect, detach, agent shutdown), and ``status`` lists the hook while it is active.
"""

from __future__ import annotations

import importlib
import itertools
import threading
import time

from . import agent_log
from .protocol import ERR_FAILED, ERR_USAGE

TYPE_CHECKING = False  # not typing's: a target without it pays ~5 ms for it (issue 23)
if TYPE_CHECKING:
    from typing import Any, Callable

    Handler = Callable[["Context"], "dict[str, Any]"]

log = agent_log.LOG
# Command modules that log through neither logging nor anything that does: loading them does
# not import logging (tests/unit/test_agent_log.py checks). Any other binds logging first, so
# that the lines of what it imports (the triggers) reach the agent log (agent_log.py).
_WITHOUT_LOGGING = frozenset({"status", "stack"})

# command name -> "module:function" under agent/commands; imported on first use so that the
# agent starts with the smallest footprint possible.
HANDLERS: dict[str, str] = {
    "status": "status:handle",
    "stack": "stack:handle",
    "watch": "watch:handle_watch",
    "trace": "trace:handle_trace",
    "torch memory": "torch_memory:handle_memory",
    "torch tensors": "torch_tensors:handle_tensors",
    "torch profile": "torch_profile:handle_profile",
    "torch fr": "torch_fr:handle",
    "torch dataloader": "torch_dataloader:handle_dataloader",
    "torch grads": "torch_grads:handle_grads",
    "torch anomaly": "torch_anomaly:handle_anomaly",
    "arm": "arm:handle_arm",
    "disarm": "arm:handle_disarm",
}


class CommandError(Exception):
    """A failure to report to the user: a message, the fix, and a kind (see protocol.ERR_*)."""

    def __init__(self, message: str, hint: str = "", kind: str = ERR_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.kind = kind

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message, "hint": self.hint}



def lookup(cmd: str) -> Handler:
    target = HANDLERS.get(cmd)
    if target is None:
        known = ", ".join(sorted(HANDLERS))
        raise CommandError(f"unknown command {cmd!r}", f"known commands: {known}", ERR_USAGE)
    module_name, func_name = target.split(":")
    if module_name not in _WITHOUT_LOGGING:
        agent_log.use_logging()
    module = importlib.import_module(f"{__package__}.commands.{module_name}")
    handler: Handler = getattr(module, func_name)
    return handler


class AgentState:
    """What the agent has installed in the target, so that detach can remove all of it."""

    def __init__(self, version: str = "") -> None:
        self.version = version
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # hook id -> (description, remove callable)
        self._hooks: dict[int, tuple[str, Callable[[], None]]] = {}
        self._contexts: set[Context] = set()

    def add_hook(self, description: str, remove: Callable[[], None]) -> int:
        with self._lock:
            hook_id = next(self._ids)
            self._hooks[hook_id] = (description, remove)
        return hook_id

    def remove_hook(self, hook_id: int) -> None:
        with self._lock:
            entry = self._hooks.pop(hook_id, None)
        if entry is not None:
            _run_quietly(entry[1], entry[0])

    def active_hooks(self) -> list[str]:
        with self._lock:
            return [desc for desc, _ in self._hooks.values()]

    def track(self, ctx: Context) -> None:
        with self._lock:
            self._contexts.add(ctx)

    def untrack(self, ctx: Context) -> None:
        with self._lock:
            self._contexts.discard(ctx)

    def remove_all(self) -> None:
        """Cancel every running request and remove every hook (detach, shutdown)."""
        with self._lock:
            contexts = list(self._contexts)
        for ctx in contexts:
            ctx.cancel()
        with self._lock:
            hooks = list(self._hooks.items())
            self._hooks.clear()
        for _, (desc, remove) in reversed(hooks):
            _run_quietly(remove, desc)


def _run_quietly(fn: Callable[[], None], what: str) -> None:
    try:
        fn()
    except BaseException:  # a failing cleanup must not stop the others
        log.exception("removing %s failed", what)


class Context:
    """One request: its arguments, its stream to the client, its cancellation and its hooks."""

    def __init__(
        self,
        args: dict[str, Any] | None = None,
        emit: Callable[[dict[str, Any]], None] | None = None,
        agent: AgentState | None = None,
    ) -> None:
        self.args: dict[str, Any] = dict(args or {})
        self._emit = emit
        self.agent = agent if agent is not None else AgentState()
        self._cancel = threading.Event()
        self._hook_ids: list[int] = []
        self._lock = threading.Lock()

    # -- streaming -------------------------------------------------------------------------
    def emit(self, data: dict[str, Any]) -> bool:
        """Send one streaming event; returns False (and cancels) if the client is gone."""
        if self._cancel.is_set():
            return False
        if self._emit is None:
            return True
        try:
            self._emit(data)
        except OSError:
            self.cancel()
            return False
        return True

    # -- cancellation ----------------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None) -> bool:
        """Sleep up to ``timeout`` seconds; returns True as soon as the request is cancelled."""
        return self._cancel.wait(timeout)

    # -- hooks -----------------------------------------------------------------------------
    def add_hook(self, description: str, remove: Callable[[], None]) -> None:
        hook_id = self.agent.add_hook(description, remove)
        with self._lock:
            self._hook_ids.append(hook_id)

    def remove_hooks(self) -> None:
        """Remove this request's hooks, newest first. Safe to call more than once."""
        with self._lock:
            ids, self._hook_ids = self._hook_ids, []
        for hook_id in reversed(ids):
            self.agent.remove_hook(hook_id)

    # -- argument helpers ------------------------------------------------------------------
    def arg(self, name: str, default: Any = None) -> Any:
        return self.args.get(name, default)


def run(ctx: Context, cmd: str) -> dict[str, Any]:
    """Run one command to completion; hooks are removed whatever happens."""
    ctx.agent.track(ctx)
    try:
        result = lookup(cmd)(ctx)
        return result if isinstance(result, dict) else {"value": result}
    finally:
        ctx.remove_hooks()
        ctx.agent.untrack(ctx)
