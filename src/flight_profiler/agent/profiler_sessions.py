"""One torch.profiler session per recorded call (see call_window for why), in the call's thread.

``PerCall(torch, kwargs, roles)``: ``start(i)``/``stop(i)`` for call_window.record_calls.
``roles[i]`` says what call i is for: "active" (profiled and kept), "warmup" (profiled and
dropped: the first sessions pay kineto's start-up), "wait" (not profiled). Active calls are
wrapped in a ``ProfilerStep#i`` record_function when ``steps`` is set, as torch.profiler's own
schedule does, and in a ``mark`` annotation when one is given (step_marks.CALL_MARK: the report
then knows these steps are calls of a method). ``stop()`` only ends collection (PyTorch parses results lazily); exporting
happens later in the agent's thread. ``finish()`` returns the kept sessions and makes any late
one (a call still in flight after a cancel) be discarded when it ends.

Except with CUDA activity: a session exported after a newer one has started comes back with
every GPU event at ts=0, dur=0 (measured on an H100, torch 2.11: 3 sessions exported at the
end gave 16 of 16 kernels at ts=0 in the first two, none in the last; exported each right after
its stop, none). So with ``export_dir`` set, a CUDA session is exported in ``stop()``, on the
call's thread after the call has ended, and kept as an ``ExportedSession`` (its file).

Every session starts through ``start_profiler``: see there for the crash it prevents.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from .call_window import Sessions
from .safepoint import SafePointTimeout, run_in_main_thread
from .torch_support import QuietStderr, quiet_native_stderr


class ExportedSession:
    """A profiler session already exported to a temp file; ``export_chrome_trace`` moves it into
    place (same directory: a rename). The file is removed if nobody takes it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._finalizer = weakref.finalize(self, _unlink, path)

    def export_chrome_trace(self, dest: str) -> None:
        os.replace(self.path, dest)
        self._finalizer.detach()


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class PerCall:
    def __init__(self, torch: Any, kwargs: dict[str, Any], roles: list[str] | None = None,
                 steps: bool = False, sync_cuda: bool = False, marks: list[str] | None = None,
                 export_dir: str | None = None) -> None:
        self.torch = torch
        self.marks = marks or []
        self.kwargs = kwargs
        self.roles = roles
        self.steps = steps
        self.sync_cuda = sync_cuda
        self.export_dir = export_dir if sync_cuda else None
        # profile_memory makes c10 log a "Memory block of unknown size" line when a block from
        # before the session is freed during it: stderr stays filtered for each such call.
        self.quiet_calls = bool(kwargs.get("profile_memory"))
        self.sessions = Sessions()
        self._live: dict[int, tuple[Any, list[Any], Any]] = {}  # index -> (prof, spans, quiet)

    def role(self, index: int) -> str:
        return self.roles[index] if self.roles is not None and index < len(self.roles) else "active"

    def start(self, index: int) -> None:
        role = self.role(index)
        if role == "wait":
            return
        quiet = QuietStderr(python_warnings=False) if self.quiet_calls else None
        try:
            prof = self.torch.profiler.profile(**self.kwargs)
            start_profiler(prof)
        except BaseException:
            if quiet is not None:
                quiet.close()
            raise
        spans = []
        if role == "active":
            names = ([f"ProfilerStep#{index}"] if self.steps else []) + self.marks
            for name in names:
                span = self.torch.autograd.profiler.record_function(name)
                span.__enter__()
                spans.append(span)
        self._live[index] = (prof, spans, quiet)

    def stop(self, index: int) -> None:
        entry = self._live.pop(index, None)
        if entry is None:
            return
        prof, spans, quiet = entry
        try:
            for span in reversed(spans):
                span.__exit__(None, None, None)
            if self.sync_cuda:
                self.torch.cuda.synchronize()
            stop_profiler(prof)
        finally:
            if quiet is not None:
                quiet.close()
        if self.role(index) != "active":
            return
        if self.export_dir is not None:
            prof = self._export_now(prof)
        self.sessions.keep(index, prof)

    def _export_now(self, prof: Any) -> ExportedSession:
        fd, tmp = tempfile.mkstemp(prefix=".fp-session-", suffix=".json", dir=self.export_dir)
        os.close(fd)
        session = ExportedSession(tmp)
        with quiet_native_stderr():
            prof.export_chrome_trace(tmp)
        release(prof)
        return session

    def finish(self) -> list[Any]:
        """The kept sessions in call order; a call still in flight is dropped when it ends."""
        for _, _, quiet in list(self._live.values()):
            if quiet is not None:
                quiet.close()  # the target gets its stderr back now, whatever that call does
        return [prof for _, prof in self.sessions.close()]


# Long enough that no thread waiting for the GIL asks for it while a session starts.
_NO_SWITCH_S = 1000.0


@contextlib.contextmanager
def no_other_python() -> Iterator[None]:
    """No other Python thread runs in this thread's C calls meanwhile: the garbage collector is
    off (a collection runs finalizers, whose bytecode hands the GIL over at the next switch) and
    the switch interval is raised (no thread asks for the GIL in between). Both are put back."""
    was_enabled = gc.isenabled()
    interval = sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(_NO_SWITCH_S)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if was_enabled:
            gc.enable()


class _TorchWithoutLazyInductor:
    """torch, as torch.profiler's module sees it while our session starts, except that
    ``hasattr(torch, "_inductor")`` does not import inductor when the target never did.

    torch.profiler's ``prepare_trace`` asks ``hasattr(torch, "_inductor")`` to read inductor's
    cudagraphs setting, and ``_inductor`` is one of torch's lazy modules: the question imports it
    (torch 2.13 here: torch._dynamo, sympy, about 800 modules, +71 MiB and 3 to 17 s in the
    target, holding its import lock, for a profile of a job that never compiled anything). A
    target that never imported inductor compiled nothing with cudagraphs, which is the answer
    torch wants; everything else is torch itself."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        if name == "_inductor" and "torch._inductor" not in sys.modules:
            raise AttributeError(name)
        return getattr(self._torch, name)


@contextlib.contextmanager
def inductor_left_alone(prof: Any) -> Iterator[None]:
    """While a session of ``prof`` starts, its profiler module's ``torch`` does not import
    inductor (see _TorchWithoutLazyInductor). Other threads run no Python meanwhile
    (``no_other_python``), so none sees the stand-in."""
    module = sys.modules.get(type(prof).__module__)
    torch = getattr(module, "torch", None)
    if module is None or torch is None or "torch._inductor" in sys.modules \
            or getattr(torch, "__name__", None) != "torch":
        yield
        return
    module.torch = _TorchWithoutLazyInductor(torch)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.torch = torch  # type: ignore[attr-defined]


def start_profiler(prof: Any) -> None:
    """``prof.start()`` without the crash it can cause in a busy process.

    With ``with_stack``, starting a session walks every Python thread's frames (torch's
    PythonTracer) and materialises a frame object for each. On CPython <= 3.11 an allocation may
    run the garbage collector right there, and a finalizer's bytecode may hand the GIL over: the
    other threads then run in the middle of the walk, return from frames it holds, and the walk
    follows a frame that is gone. Seen as a rank of a DDP trainer killed by SIGSEGV or SIGABRT
    (``PyFrame_GetBack`` on a freed frame; torch's ``frame_refcount >= 2`` assertion): 1 of 62
    diagnoses here, 1 in 14 in issue 20; the core dump shows the walk holding the finished frames
    of the DataLoader's prefetch thread (bench/stress_ddp_diagnose.py). No collection and no
    switch during the start: the walk sees every thread as it is, as torch expects."""
    with no_other_python(), quiet_native_stderr(), inductor_left_alone(prof):
        prof.start()


def stop_profiler(prof: Any) -> None:
    """``prof.stop()`` likewise: it takes the tracer off every thread's state in turn."""
    with no_other_python(), quiet_native_stderr():
        prof.stop()


def release(prof: Any) -> None:
    """Let a stopped session go as soon as its last reference does, in the thread that drops
    it. A ``torch.profiler.profile`` holds bound methods of itself (its ``action_map``): a
    cycle, so its results (114 MB of JSON when exported, for 3 LBFGS steps under with_stack)
    waited for the cyclic GC, which then freed them in whichever thread allocated next: 0.3 s
    inside the target's next step (in diagnose, inside the census after it). Only for a
    session that is stopped and exported: the map drives its start/stop transitions."""
    attributes = getattr(prof, "__dict__", None)
    if isinstance(attributes, dict):
        attributes.pop("action_map", None)


# How long a session's stop waits for the main thread's next safe point when no step boundary
# came (BoundaryStop.stop).
MAIN_THREAD_WAIT_S = 1.0


class BoundaryStop:
    """Stops an all-threads session at the next step boundary a training thread reaches (the
    method's entry, a backward's, an optimizer step's end: ``boundary`` is called from those
    hooks), in that thread, between two of its ops; from the agent's thread only when none
    comes in time (``stop``).

    Why: stopped from the agent's thread, the session's state was freed while the training
    thread was inside an op (the GIL released) whose end callback still used it: SIGSEGV in
    a DDP trainer's ``dropout``, faulthandler's traceback showing the agent in ``prof.stop()``
    (2 of about 190 diagnoses, then 1 in 38 back-to-back windows on that trainer). In the
    training thread itself no op of its own is in flight, and a scope it opened during the
    session ends on a stopped profiler, which torch's exit callbacks allow for."""

    def __init__(self, prof: Any, before: Callable[[], Any] | None = None) -> None:
        self._prof = prof
        self._before = before  # right before the stop, in the same thread (a CUDA synchronize)
        self._lock = threading.Lock()
        self._requested = False
        self._started = False  # a stop is under way, in some thread
        self.done = threading.Event()
        self.where = ""  # the thread that stopped the session
        self._error: BaseException | None = None

    def _claim(self) -> bool:
        """Whether this caller is the one to stop; never blocks: a stop under way may be this
        very thread's (the main thread's pending call runs inside torch's Python stop, and a
        blocking wait there deadlocked it)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._started:
                return False
            self._started = True
            return True
        finally:
            self._lock.release()

    def _stop_here(self, where: str) -> None:
        try:
            if self._before is not None:
                self._before()
            stop_profiler(self._prof)
        except BaseException as exc:  # raised in the agent's thread (stop), never here
            self._error = exc
        finally:
            self.where = where
            self.done.set()

    def boundary(self) -> None:
        """From the target's hooks: stop here if a stop was asked for and none is under way."""
        if self._requested and not self._started and self._claim():
            self._stop_here(threading.current_thread().name)

    def stop(self, wait: float, main_wait: float = MAIN_THREAD_WAIT_S) -> None:
        """Ask for the stop; after ``wait`` s without a boundary, in the main thread between
        two bytecodes (an inference loop's ops in flight are its); after ``main_wait`` s more
        (a main thread parked in ``join()``), from this thread. A stop under way elsewhere is
        waited for: torch's post-processing takes seconds on a dense window."""
        self._requested = True
        if wait > 0:
            self.done.wait(wait)
        if not self._started:
            with contextlib.suppress(SafePointTimeout):
                run_in_main_thread(self.boundary, main_wait)
        if not self._started and self._claim():
            self._stop_here("agent")
        self.done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def schedule_roles(wait: int, warmup: int, active: int, repeat: int) -> list[str]:
    return (["wait"] * wait + ["warmup"] * warmup + ["active"] * active) * repeat
