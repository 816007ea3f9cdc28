"""Hold every other Python thread at a safe point while a function runs in the calling thread.

Why: reading tensors' metadata (``grad_fn``, storage) while another thread is inside a torch op
with the GIL released is a data race in PyTorch's C++ (a census taken that way crashed a CPU
training loop one run in six). Running the walk in the main thread (a pending call) avoided
it only when the main thread itself does the torch work and keeps executing Python: a main
thread parked in ``join()`` while a worker serves requests never got there.

How: a C-level profile function is set on every other thread's state (``_PyEval_SetProfile``,
exported by CPython 3.9-3.13 and meant to be called for another thread). A thread's next profile
event (a Python or C function call or return) happens between two operations, never inside
one: there the thread waits until the walk is done. A thread that reaches no event is accepted
only when its top Python frame is blocked in a known waiting call (``join``, ``acquire``,
``sleep``, ``get``, ``select``...): if it wakes, its first event is the return from that call,
so it is held before it can start an op. Anything else (a long native op) makes the gate give
up after its budget, naming the thread and where it is, and nothing is run.

A profile function a thread had already (cProfile, a target's own sys.setprofile) is saved
before ours replaces it and put back afterwards: its place in the thread state is found by
setting a known one in our own thread and looking for it. Limits: threads that run torch ops
without any Python frame (C++-only threads) cannot be held.
"""

from __future__ import annotations

import ctypes
import dis
import os
import sys
import threading
import time
import types
from typing import Any, Callable

AGENT_THREAD_PREFIX = "flight_profiler-"
# Names of calls that wait without touching tensors (threading, queue, time, select, socket...).
_BLOCKING = frozenset({
    "acquire", "wait", "wait_for", "join", "sleep", "get", "select", "poll", "recv", "recv_into",
    "recvfrom", "accept", "read", "readinto", "readline", "input", "waitpid", "wait_for_tstate_lock",
    "_wait_for_tstate_lock", "serve_forever", "getch", "connect", "send", "sendall", "communicate",
})
_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST",
                    "LOAD_DEREF", "LOAD_FAST_LOAD_FAST", "LOAD_SUPER_ATTR"})
_PROFILE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                            ctypes.c_void_p)


class GateTimeout(Exception):
    """Some thread could not be held at a safe point in time; nothing was run."""


class GateUnsupported(GateTimeout):
    """No gate on this interpreter (see ``supported``); nothing was run."""


class _State:
    def __init__(self) -> None:
        self.active = False
        self.release = threading.Event()
        self.held: set[int] = set()
        self.exempt: set[int] = set()
        self.lock = threading.Lock()
        self.owner: threading.Thread | None = None
        self.pid = os.getpid()  # the process whose threads are held


_STATE = _State()
_RUN_LOCK = threading.Lock()  # one gate at a time


def _on_event(_obj: Any, _frame: Any, _what: int, _arg: Any) -> int:
    """The profile function: runs in the target thread, between two operations."""
    st = _STATE
    try:
        if not st.active or os.getpid() != st.pid:
            # A child forked while the gate was on (a DataLoader worker) inherits this function
            # on its one thread; no one there will ever release it: never wait there.
            return 0
        me = threading.get_ident()
        if me in st.exempt:
            return 0
        with st.lock:
            st.held.add(me)
        # Held for as long as the walk runs (a time limit here would let the thread run an op
        # during a long walk), but never past the death of the thread that holds the gate.
        owner = st.owner
        while not st.release.wait(1.0):
            if owner is None or not owner.is_alive() or os.getpid() != st.pid:
                break
        with st.lock:
            st.held.discard(me)
    except KeyboardInterrupt:
        # A signal raised while held cannot cross this C callback: deliver it again.
        if threading.current_thread() is threading.main_thread():
            import _thread
            _thread.interrupt_main()
    except BaseException:  # never into the target's code
        pass
    return 0


_CALLBACK = _PROFILE(_on_event)


def supported() -> bool:
    api = ctypes.pythonapi
    return (3, 9) <= sys.version_info[:2] < (3, 14) and hasattr(api, "_PyEval_SetProfile") \
        and getattr(sys, "_is_gil_enabled", lambda: True)()


def _api() -> Any:
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Get.restype = ctypes.c_void_p
    api._PyEval_SetProfile.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    api._PyEval_SetProfile.restype = ctypes.c_int
    api.Py_IncRef.argtypes = [ctypes.c_void_p]
    api.Py_DecRef.argtypes = [ctypes.c_void_p]
    return api


_OFFSETS: tuple[int, int] | None = None  # (c_profilefunc, c_profileobj) in a thread state


def _profile_offsets(api: Any) -> tuple[int, int] | None:
    """Where a thread state keeps its profile function and object (None: not found)."""
    global _OFFSETS
    if _OFFSETS is not None:
        return _OFFSETS
    marker = _ProfileMarker()
    previous = sys.getprofile()
    me = api.PyThreadState_Get()
    sys.setprofile(marker)
    try:
        want = id(marker)
        for off in range(0, 1024, ctypes.sizeof(ctypes.c_void_p)):
            if ctypes.c_void_p.from_address(me + off).value == want:
                # 3.9-3.13: c_profilefunc, c_tracefunc, c_profileobj, c_traceobj
                func_off = off - 2 * ctypes.sizeof(ctypes.c_void_p)
                if ctypes.c_void_p.from_address(me + func_off).value:
                    _OFFSETS = (func_off, off)
                break
    finally:
        sys.setprofile(previous)
    return _OFFSETS


class _ProfileMarker:
    def __call__(self, *_a: Any) -> None:
        return None


_SAVED: dict[int, tuple[int, int]] = {}  # thread state -> its own (profile func, object)


def _set_profile_on_others(install: bool) -> None:
    """Set our profile function on every thread state but the caller's, saving the one each
    had; or put the saved ones back (``install=False``).

    A thread state is freed when its thread exits, which needs the GIL: with the switch
    interval raised, no other thread gets the GIL between our calls, so no state we hold a
    pointer to can go away meanwhile.
    """
    api = _api()
    func = ctypes.cast(_CALLBACK, ctypes.c_void_p).value if install else None
    offsets = _profile_offsets(api)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        me = api.PyThreadState_Get()
        ts = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
        while ts:
            if ts != me:
                if install:
                    if ts not in _SAVED and offsets is not None:
                        own_func = ctypes.c_void_p.from_address(ts + offsets[0]).value or 0
                        own_obj = ctypes.c_void_p.from_address(ts + offsets[1]).value or 0
                        if own_func and own_func != func:
                            if own_obj:
                                api.Py_IncRef(ctypes.c_void_p(own_obj))
                            _SAVED[ts] = (own_func, own_obj)
                    api._PyEval_SetProfile(ts, func, None)
                else:
                    own_func, own_obj = _SAVED.get(ts, (0, 0))
                    api._PyEval_SetProfile(ts, own_func or None, own_obj or None)
            ts = api.PyThreadState_Next(ts)
        if not install:
            for _f, obj in _SAVED.values():
                if obj:  # the reference we took; a restored state took its own
                    api.Py_DecRef(ctypes.c_void_p(obj))
            _SAVED.clear()
    finally:
        sys.setswitchinterval(old)


def blocked_in(frame: Any) -> str | None:
    """The name of the waiting call a frame is inside, if its current call is a known one."""
    try:
        code = frame.f_code
        lasti = frame.f_lasti
        names: list[str] = []
        local: set[str] = set()
        for ins in dis.get_instructions(code):
            if ins.offset >= lasti:
                break
            if ins.opname.startswith("CALL") or ins.opname.startswith("PRECALL"):
                if not ins.opname.startswith("PRECALL"):
                    names = []
            elif ins.opname in _LOADS and isinstance(ins.argval, str):
                names.append(ins.argval)
                if ins.opname in ("LOAD_FAST", "LOAD_DEREF"):
                    local.add(ins.argval)
            elif ins.starts_line:
                names = []
        for name in reversed(names):
            if name in _BLOCKING:
                return name
        for name in reversed(names):
            if name in local:
                alias = _aliased_blocking_call(frame, name)
                if alias is not None:
                    return alias
    except Exception:
        return None
    return None


def _aliased_blocking_call(frame: Any, name: str) -> str | None:
    """The blocking builtin a local variable names: the stdlib binds them to locals in hot
    loops (multiprocessing's queue feeder thread waits in ``nacquire = notempty.acquire``).

    Before 3.13 reading ``f_locals`` fills a snapshot dict cached on the frame; it is emptied
    again (safe unless a tracer or the function itself reads it back: then it is not read).
    """
    code = frame.f_code
    snapshot = sys.version_info < (3, 13)
    if snapshot and (frame.f_trace is not None or "locals" in code.co_names
                     or "vars" in code.co_names):
        return None
    values = frame.f_locals
    try:
        value = values.get(name)
        called = getattr(value, "__name__", None) if isinstance(value, types.BuiltinMethodType) else None
    finally:
        if snapshot:
            values.clear()
        values = value = None
    return called if called in _BLOCKING else None


def _where(frame: Any) -> str:
    code = frame.f_code
    return f"{code.co_name}() at {code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"


def run_with_threads_held(fn: Callable[[], Any], timeout: float,
                          cancelled: Callable[[], bool] | None = None) -> Any:
    """Hold every other Python thread at a safe point, run ``fn()`` here, release them.

    Refused (GateUnsupported) where ``supported()`` is false: on CPython 3.14 setting another
    thread's profile function here deadlocked, 7 runs of 30 on a loaded machine (the agent's
    thread stuck in ``_PyEval_SetProfile``, two threads held for good)."""
    if not supported():
        raise GateUnsupported(f"no thread gate on Python {sys.version_info[0]}.{sys.version_info[1]}")
    with _RUN_LOCK:
        st = _STATE
        me = threading.get_ident()
        st.exempt = {t.ident for t in threading.enumerate()
                     if t.ident is not None and t.name.startswith(AGENT_THREAD_PREFIX)} | {me}
        st.release.clear()
        st.held = set()
        st.owner = threading.current_thread()
        st.pid = os.getpid()
        st.active = True
        try:
            _wait_until_held(st, timeout, cancelled)
            return fn()
        finally:
            st.active = False
            st.release.set()
            _set_profile_on_others(False)


def _wait_until_held(st: _State, timeout: float, cancelled: Callable[[], bool] | None) -> None:
    deadline = time.monotonic() + timeout
    known: set[int] = set()
    while True:
        frames = sys._current_frames()
        try:
            threads = set(frames) - st.exempt
            if not threads <= known:
                # New threads (or the first pass): give them the profile function too.
                _set_profile_on_others(True)
                known |= threads
            with st.lock:
                held = set(st.held)
            pending = {}
            for ident in threads - held:
                if blocked_in(frames[ident]) is None:
                    pending[ident] = _where(frames[ident])
        finally:
            frames.clear()
        if not pending:
            return
        if time.monotonic() >= deadline or (cancelled is not None and cancelled()):
            names = {t.ident: t.name for t in threading.enumerate()}
            ident, where = next(iter(pending.items()))
            raise GateTimeout(
                f"thread {names.get(ident, ident)!r} stayed inside one native call in {where} "
                f"for over {timeout:g}s (a long torch op, or a C extension)")
        time.sleep(0.002)
