"""``arm --on slow FACTOR [--steps N]``: a step slower than FACTOR x the running median of
step times; profile the next N steps.

Idle cost: no hook of its own. The step clock's post-step hook (step_clock.py) already times
each step (``last_period``: from the end of one ``optimizer.step()`` to the end of the next,
data loading included); this listener appends it to a window of the last :data:`WINDOW` step
times and compares it with a median recomputed every :data:`REFRESH` steps (a sort of 101
floats every 10 steps: ~0.3 us a step, nothing per step beyond an append and a compare).

Fires on the second step in a row over FACTOR x the median: one slow step alone is a checkpoint
save, an evaluation pass, a garbage collection or the process descheduled on a busy machine
(seen: single 50 ms steps in a 22 ms loop on a loaded 2-core box), and with --max-fires 1 it
would spend the trigger on noise; a slowdown that lasts (a slower data shard, a bigger batch)
shows on the next step too. Every step that is not profiled goes into the window, slow or not.
The event names the second slow step (its time, the median, the first one's time too).

Warm-up: no judgement before :data:`WARMUP` step times are in the window (20: the first steps
of a job, or of a job the agent just attached to, pay torch's one-time costs, and a median of
fewer steps moves with every odd step). After a fire (and while profiling) the next
:data:`WARMUP` steps are neither timed into the window nor judged: the profiled steps are
slower by the profiler's own cost, and the trace export competes for the GIL afterwards.

Firing: the training thread (in the hook) only takes the right to fire and starts one agent
thread (``flight_profiler-slow``). That thread starts a torch.profiler session over ALL threads
(``profile_all_threads``, as ``torch profile --window`` does: the session is started by an agent
thread and ended at the training thread's next step end, in it, or by the agent thread when
none comes, so a disarm, a timeout or a job that stops stepping ends it whatever the training
thread does next; profiler_sessions.BoundaryStop), waits for N + 1 more step ends (N whole steps between the marks
``flight_profiler.optimizer_step#k`` that the hook writes into the trace while it runs, as
step_marks.py does for the window), stops it, and writes ``slow_steps.pt.trace.json`` (Chrome
trace, torch's exporter, through the event's descriptor) with ``event.json``: the slow step's
time, the median, FACTOR, and the profiled steps' own times. A disarm while it waits stops the
session and writes nothing.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections import deque
from typing import Any

from ..profile_window import all_threads_config, stop_at_boundary
from ..profiler_sessions import BoundaryStop, start_profiler
from ..step_marks import StepMarks
from ..torch_support import cuda_in_use, quiet_native_stderr
from .base import Trigger
from .evidence import Event, EvidenceDir

log = logging.getLogger("flight_profiler.agent")
WARMUP = 20
WINDOW = 101
REFRESH = 10
CONSECUTIVE = 2
TRACE_FILE = "slow_steps.pt.trace.json"
THREAD_NAME = "flight_profiler-slow"
_MIN_WAIT_S = 10.0
_MAX_WAIT_S = 600.0


def _import_inductor() -> None:
    # torch is in sys.modules already (install() checked): this only loads one of its modules
    try:
        importlib.import_module("torch._inductor.config")
    except BaseException:  # never into threading.excepthook (it prints to stderr)
        log.debug("arm: importing torch._inductor failed", exc_info=True)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class SlowTrigger(Trigger):
    kind = "slow"
    needs_clock = True

    def __init__(self, out: EvidenceDir, max_fires: int, rank: dict[str, Any], factor: float,
                 steps: int) -> None:
        super().__init__(out, max_fires, rank)
        self.factor = factor
        self.steps = steps
        self.window: deque[float] = deque(maxlen=WINDOW)
        self.median: float | None = None
        self._added = 0
        self._skip = 0  # steps neither timed nor judged (while profiling and after)
        self.slowest_ratio = 0.0
        self._slow_run: list[float] = []  # the slow steps in a row so far
        self._marks: StepMarks | None = None
        self._profiled: list[float] = []
        self._step_done = threading.Event()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._fired_wall: float | None = None
        self.started_after_s: float | None = None

    def install(self) -> list[str]:
        torch = sys.modules.get("torch")
        if torch is None or "torch.optim.optimizer" not in sys.modules:
            raise RuntimeError("--on slow: the job has not imported torch.optim (no optimizer step to time)")
        if all_threads_config(torch) is None:
            raise RuntimeError("--on slow: this torch cannot profile all threads (no "
                               "profile_all_threads in torch.profiler's experimental config)")
        if "torch._inductor" not in sys.modules:
            # torch's profiler imports torch._inductor when it first starts (prepare_trace's
            # hasattr(torch, "_inductor")): seconds (17 s on a loaded 2-core box). Paid now, in
            # the background, the profile starts right after the slow steps when it fires.
            threading.Thread(target=_import_inductor, name=f"{THREAD_NAME}-warm", daemon=True).start()
        return [f"slow: judged after {WARMUP} steps against the median of the last {WINDOW}; "
                f"{CONSECUTIVE} steps in a row over {self.factor:g} x the median profile the next "
                f"{self.steps}"]

    def params(self) -> dict[str, Any]:
        return {"factor": self.factor, "steps": self.steps}

    def detail(self) -> dict[str, Any]:
        return {"median_step_s": round(self.median, 6) if self.median else None,
                "steps_timed": self._added, "slowest_ratio": round(self.slowest_ratio, 2)}

    # -- the training thread ------------------------------------------------------------------
    def on_post_step(self, clock: Any, optimizer: Any, is_step: bool) -> None:
        marks = self._marks
        if marks is not None and optimizer is not None:
            marks.on_optimizer_step(optimizer, None, None)  # step boundaries in the trace
        if not is_step:
            return
        period = clock.last_period
        if marks is not None:
            if period is not None and len(self._profiled) <= self.steps:
                self._profiled.append(period)
            self._step_done.set()
            return
        if period is None or not self.live:
            return
        if self._skip:
            self._skip -= 1
            return
        typical = self.median
        if typical is not None and period > self.factor * typical:
            self.slowest_ratio = max(self.slowest_ratio, period / typical)
            self._slow_run.append(period)
            if len(self._slow_run) >= CONSECUTIVE:
                self._fire(clock, period, typical)
                self._slow_run = []
                return
        else:
            self._slow_run = []
        self.window.append(period)
        self._added += 1
        if self._added >= WARMUP and (self.median is None or self._added % REFRESH == 0):
            self.median = median(list(self.window))

    def _fire(self, clock: Any, period: float, median: float) -> None:
        if not self.begin_fire():
            return
        self._skip = WARMUP
        self._profiled = []
        self._step_done.clear()
        at = (clock.steps, clock.last_step_wall)
        self._fired_wall = clock.last_step_wall
        self._thread = threading.Thread(target=self._run, args=(clock, at, list(self._slow_run),
                                                                 period, median),
                                        name=THREAD_NAME, daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._thread = None
            self.end_fire()
            raise

    # -- the agent's thread ----------------------------------------------------------------------
    def _run(self, clock: Any, at: tuple[int, float | None], run: list[float], period: float,
             median: float) -> None:
        try:
            torch = sys.modules["torch"]
            use_cuda = cuda_in_use(torch)
            session, started_at, timed_out = self._profile(torch, clock, period, use_cuda)
            if session is None:
                return  # disarmed meanwhile: nothing written
            doc = {"slow_step": at[0], "slow_step_end": at[1], "slow_step_s": period,
                   "slow_run_s": run, "consecutive": CONSECUTIVE, "median_s": median,
                   "factor": self.factor, "ratio": period / median if median else None,
                   "steps_wanted": self.steps, "profiled_from_step": started_at,
                   "profile_started_after_s": self.started_after_s,
                   "profiled_step_s": list(self._profiled[1:]), "timed_out": timed_out,
                   "window_steps": len(self.window), "warmup": WARMUP}
            self.write_event(lambda event: self._capture(event, session, doc))
        except BaseException:  # never into threading.excepthook (it prints to stderr)
            log.exception("arm: the slow trigger's profile failed")
        finally:
            self._marks = None
            self.end_fire()

    def _profile(self, torch: Any, clock: Any, period: float, use_cuda: bool) -> tuple[Any, int, bool]:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if use_cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=acts, record_shapes=True,
                                      experimental_config=all_threads_config(torch))
        start_profiler(prof)
        self.started_after_s = time.time() - (self._fired_wall or time.time())
        marks = StepMarks(torch, None)
        # stopped at the next optimizer step's end, in the training thread (BoundaryStop)
        stopper = BoundaryStop(prof, torch.cuda.synchronize if use_cuda else None)
        marks.boundary = stopper.boundary
        self._marks = marks
        started_at = clock.steps
        # N whole steps lie between N + 1 step ends; a job that stops stepping is not waited on
        # for ever (a few times the slow step's own length per step, bounded)
        wait = min(_MAX_WAIT_S, max(_MIN_WAIT_S, 4 * (self.steps + 1) * period))
        deadline = time.monotonic() + wait
        timed_out = False
        try:
            while clock.steps < started_at + self.steps + 1:
                if self._cancel.is_set():
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                self._step_done.wait(0.05)
                self._step_done.clear()
        finally:
            try:
                stop_at_boundary(stopper, self._cancel.is_set(), True)
            finally:
                self._marks = None  # no new mark once the session has ended
        if self._cancel.is_set():
            return None, started_at, timed_out
        return prof, started_at, timed_out

    def _capture(self, event: Event, prof: Any, doc: dict[str, Any]) -> dict[str, Any]:
        with quiet_native_stderr():
            prof.export_chrome_trace(event.proc_path(TRACE_FILE))
        # torch's exporter wrote it with the job's umask and without fsync: make it like the
        # event's other files (0600, on disk before the directory is renamed into place)
        fd = os.open(TRACE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=event.fd)
        try:
            os.fchmod(fd, 0o600)
            os.fsync(fd)
        finally:
            os.close(fd)
        event.adopt(TRACE_FILE)
        return {**doc, "trace": TRACE_FILE}

    def remove(self) -> list[str]:
        self._cancel.set()
        self._step_done.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
            if thread.is_alive():
                return ["the slow trigger's profile was still being written"]
        return []

