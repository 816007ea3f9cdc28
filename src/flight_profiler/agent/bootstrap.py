"""The text the injector runs inside the target (by PyRun_SimpleString, in ``__main__``).

The injector sends this file's source wrapped as
``try: exec(SOURCE, {"__name__": "_flight_profiler_bootstrap", "_FP": params})
except BaseException: pass``, so nothing lands in the target's ``__main__`` and nothing can
escape: an exception leaking out of a pending call kills the target's main thread
(``SystemError: error return without exception set``), and ``SystemExit`` would end the process.

``params``: ``pkg`` (directory of the agent package as the target sees it), ``deadline`` (epoch
seconds after which the CLI has given up: then do nothing, the target stays as it was),
``foreign`` (True when run by a native thread the helper started rather than by a pending call),
``log`` (log file), ``version``.

Idempotent: if an agent is already loaded it is reused; if its server stopped (detach) it starts
again. The package is loaded under the private name ``_flight_profiler_agent`` straight from
``pkg``: the CLI's site-packages never go onto the target's ``sys.path``. Stdlib only, and as few
GIL releases as possible (each one costs a full switch interval when another thread hogs the GIL).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a target without it pays ~5 ms for it (issue 23)
if TYPE_CHECKING:
    from typing import Any

_NAME = "_flight_profiler_agent"


def _guess_main_ident(me: int) -> int | None:
    """The main thread's ident, seen from a native thread, before ``threading`` is imported.

    Without ``threading`` the target has (almost surely) no other Python thread than its main
    one; if there are several, the main thread is the one whose outermost frame is a module.
    """
    import _thread
    import sys

    exact = getattr(_thread, "_get_main_thread_ident", None)  # 3.13+
    if exact is not None:
        return int(exact())
    others = [ident for ident in sys._current_frames() if ident != me]
    if len(others) == 1:
        return others[0]
    modules = []
    for ident in others:
        frame = sys._current_frames().get(ident)
        while frame is not None and frame.f_back is not None:
            frame = frame.f_back
        if frame is not None and frame.f_code.co_name == "<module>":
            modules.append(ident)
        del frame
    return modules[0] if len(modules) == 1 else None


def _repair_main_thread(main_ident: int) -> None:
    """Make ``threading.main_thread()`` name the real main thread again.

    ``threading`` records the thread that first imports it as the main thread. Imported from our
    native thread, ``main_thread()`` would be wrong and, at the target's exit, ``_shutdown`` would
    trip over a released sentinel lock. Re-point the record at the real main thread and give it a
    held plain lock that ``_shutdown`` releases as usual (3.9-3.12). 3.13 gets the ident right
    but records the importing thread's native id.
    """
    import _thread
    import os
    import threading

    record: Any = threading._main_thread  # type: ignore[attr-defined]
    if record.ident == main_ident:
        # 3.13 finds the right ident itself but takes the native id of the importing thread
        if getattr(record, "_native_id", None) not in (None, os.getpid()):
            record._native_id = os.getpid()
        return
    with threading._active_limbo_lock:  # type: ignore[attr-defined]
        threading._active.pop(record._ident, None)  # type: ignore[attr-defined]
        record._ident = main_ident
        if hasattr(record, "_native_id"):
            record._native_id = os.getpid()
        threading._active[main_ident] = record  # type: ignore[attr-defined]
    if hasattr(record, "_tstate_lock"):
        lock = _thread.allocate_lock()
        lock.acquire()
        record._tstate_lock = lock


def _load_agent(pkg: str) -> Any:
    import importlib
    import importlib.util
    import os
    import sys

    agent = sys.modules.get(_NAME)
    if agent is not None:
        server = sys.modules.get(_NAME + ".server")
        same = list(getattr(agent, "__path__", [])) == [pkg]
        if same or (server is not None and server.running()):
            return agent
        # An older copy of the agent that is not serving: replace it by this one.
        for name in [n for n in sys.modules if n == _NAME or n.startswith(_NAME + ".")]:
            del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        _NAME, os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the agent from {pkg}")
    agent = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = agent
    try:
        spec.loader.exec_module(agent)
    except BaseException:
        del sys.modules[_NAME]
        raise
    return agent


def bootstrap(params: dict[str, Any]) -> None:
    try:
        import sys
        import time

        if time.time() > float(params.get("deadline", 0)):
            return  # the CLI gave up waiting: leave the target exactly as it was
        main_ident = None
        if params.get("foreign") and "threading" not in sys.modules:
            import _thread

            main_ident = _guess_main_ident(_thread.get_ident())
        # Two CLIs attaching at once run two bootstraps: one at a time, or two agents would
        # race for the socket. (Not the import lock: a target thread in the middle of an
        # import could then deadlock with us.) setdefault is atomic under the GIL.
        import _thread
        import types

        holder = types.ModuleType(_NAME + "_boot")
        holder.lock = _thread.allocate_lock()  # type: ignore[attr-defined]
        lock = sys.modules.setdefault(_NAME + "_boot", holder).lock
        if not lock.acquire(True, 60):
            return
        # `stack` hides this thread too while it is still busy starting the agent
        holder = sys.modules[_NAME + "_boot"]
        me = _thread.get_ident()
        holder.busy = getattr(holder, "busy", frozenset()) | {me}  # type: ignore[attr-defined]
        try:
            _load_agent(str(params["pkg"]))
            if main_ident is not None:
                _repair_main_thread(main_ident)
            import importlib

            server = importlib.import_module(_NAME + ".server")
            server.start(params)
        finally:
            holder.busy = holder.busy - {me}  # type: ignore[attr-defined]
            lock.release()
    except BaseException as exc:  # never let anything reach the target's thread
        _log_failure(params, f"bootstrap failed: {type(exc).__name__}: {exc}\n")


def _log_failure(params: dict[str, Any], line: str) -> None:
    """Append ``line`` to the agent log, only if that is a regular file of ours: opened without
    following a link and without blocking (a FIFO there would hang this thread, perhaps the
    target's main thread, until a reader came)."""
    try:
        import os
        import stat

        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(str(params.get("log", "")), flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except BaseException:
        pass


if "_FP" in globals():
    bootstrap(globals()["_FP"])
