"""Run a function in the target's main thread, between two bytecodes (fallback: thread_gate.py
holds every thread instead, where CPython allows it).

Why: reading tensors' metadata (grad_fn, storage, shape) from the agent's thread while the
training thread is inside a torch op with the GIL released is a data race in PyTorch's C++:
a census taken that way crashed a CPU training loop (SIGSEGV in ``t.grad_fn``) about one run
in six here. A pending call (``Py_AddPendingCall``, public C API on 3.9-3.14) runs in the main
thread at its next eval-breaker check, i.e. while it is executing Python, not inside an op: the
training step is paused at a safe point for as long as the walk takes.

Limits: a main thread that stays inside one native call (or blocked on a lock) does not reach a
safe point; the caller gets :class:`SafePointTimeout` and says so, rather than racing.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .registry import Context

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
# A queued pending call cannot be withdrawn: its callback must outlive a timed-out wait.
_KEEP: list[Any] = []
_KEEP_LOCK = threading.Lock()


class SafePointTimeout(Exception):
    """The main thread did not reach a safe point in time; nothing was run."""


def run_in_main_thread(fn: Callable[[], Any], timeout: float,
                       cancelled: Callable[[], bool] | None = None) -> Any:
    """Run ``fn()`` in the main thread at its next safe point and return its result.

    Called from the main thread itself, ``fn`` runs at once. Exceptions raised by ``fn`` are
    re-raised here, in the caller's thread; none reaches the main thread's own code.
    """
    if threading.current_thread() is threading.main_thread():
        return fn()
    done = threading.Event()
    lock = threading.Lock()
    state: dict[str, Any] = {"abandoned": False, "started": False}

    def trampoline(_arg: Any) -> int:
        try:
            with lock:
                go = not state["abandoned"]
                state["started"] = go
            if go:
                state["value"] = fn()
        except BaseException as exc:  # never into the main thread's code
            state["error"] = exc
        finally:
            done.set()
            with _KEEP_LOCK:
                if callback in _KEEP:
                    _KEEP.remove(callback)
        return 0

    callback = _CALLBACK(trampoline)
    with _KEEP_LOCK:
        _KEEP.append(callback)
    add = ctypes.pythonapi.Py_AddPendingCall
    add.argtypes = [_CALLBACK, ctypes.c_void_p]
    add.restype = ctypes.c_int
    if add(callback, None) != 0:  # the queue (32 entries) is full
        with _KEEP_LOCK:
            _KEEP.remove(callback)
        raise SafePointTimeout("the interpreter's pending-call queue is full")
    waited = 0.0
    while not done.wait(0.05):
        waited += 0.05
        if waited >= timeout or (cancelled is not None and cancelled()):
            with lock:
                if not state["started"]:
                    state["abandoned"] = True
                    raise SafePointTimeout(
                        f"the main thread did not reach a safe point within {timeout:g}s")
            done.wait()  # started: it is bounded by fn's own budget
            break
    if "error" in state:
        raise state["error"]
    return state.get("value")


def _torch_profiler_running() -> bool:
    """A torch profiler session may have set its Python tracer on every thread; the gate resets
    the threads' profile functions afterwards and would switch it off mid-session."""
    import sys

    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch._C._autograd._profiler_enabled())
    except Exception:
        return False


def at_safe_point(ctx: Context, fn: Callable[[], Any], what: str, timeout: float = 2.0) -> Any:
    """Run ``fn`` while no other thread can be inside a torch op; a timeout becomes a user error.

    Where CPython lets the agent hold every thread at a safe point (thread_gate.py), ``fn`` runs
    in the agent's thread with the others held: this works whichever thread does the torch work,
    including a main thread parked in ``join()``. Elsewhere, or while a torch profiler session
    runs (the gate would switch its Python tracer off), it runs in the main thread.
    """
    # Deferred: the rest of this module works loaded on its own (tests run it by file path
    # under every interpreter), without the package around it.
    from . import thread_gate
    from .registry import CommandError

    def cancelled() -> bool:
        return bool(ctx.cancelled)

    try:
        if thread_gate.supported() and not _torch_profiler_running():
            return thread_gate.run_with_threads_held(fn, timeout, cancelled=cancelled)
        return run_in_main_thread(fn, max(timeout, 15.0), cancelled=cancelled)
    except thread_gate.GateTimeout as exc:
        raise CommandError(
            f"{what}: {exc}; reading tensors while it runs could crash the process, so nothing "
            "was read",
            "retry when that call has returned; if it never returns between steps (one huge op), "
            "take the evidence from a method instead, e.g. `torch memory -r module [class] method`",
        ) from None
    except SafePointTimeout as exc:
        raise CommandError(
            f"{what}: {exc}; the main thread is inside a long native call or blocked, and "
            "reading tensors from another thread meanwhile could crash the process",
            "retry in a moment (e.g. while the job is training, not waiting)",
        ) from None
