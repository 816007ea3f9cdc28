"""The report's inputs, loaded while the workflow waits for the job.

The census window lasts ``--duration`` at least; on a fast loop its phases end sooner and the
workflow sleeps (workflow._let_it_run). The report engine's import and its loading of the
artefacts written by then (the profile's trace above all: 0.4 s of the DCGAN's 1 s report here)
are done in that sleep instead of after the last phase. Nothing is measured while the workflow
sleeps, so the CPU this takes from the target skews no figure.

The last live phases (the "after" snapshot, the gradients) measure no time: while
they run, the inputs written by then, the profile's big trace included, are loaded in a thread
(``load_behind``), so that the report does not start with seconds of decoding (a with_stack
trace of 3 LBFGS steps: 2-3 s, and no wait to hide it in, the phases of such a loop being longer
than ``--duration``).

The profile's trace, the biggest input by far, is loaded earlier still: right after the profile
phase, in a worker process of the lowest CPU priority (``load_aside``), while the phases that
measure time run. Niced to 19, it takes a core only where the target leaves one idle, so it skews
no figure; once nothing is measured any more (``load_behind``) it is given back the normal
priority, or, where that is not allowed (no CAP_SYS_NICE), stopped and the trace loaded in the
thread as before. A character RNN's with_stack trace (8-21 MB compressed) took 3.0-8.3 s of its
report when it was loaded after the last census; 0.1-0.2 s is left.

Only in a directory that no one else may write: there (root diagnosing another user's job)
evidence.analyze_artefacts reads each artefact once, through a checked descriptor, and a file
read by its name earlier could have been swapped since. A file loaded here is used only if it is
still the same file (inode, size, modification time) when the report is built.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flight_profiler.report.models import InputResult

# A file bigger than this (decoded; gzip shrinks traces ~10x) is left to the report: it takes
# seconds, longer than a wait, and the engine loads big ones in worker processes, in parallel.
PRELOAD_MAX_BYTES = 12 << 20

Signature = tuple[int, int, int]
# The longest the report waits for a worker's load once it runs at the normal priority; past it
# the worker is stopped and the report loads the file itself.
ASIDE_WAIT_S = 120.0
ASIDE_NICE = 19


def _signature(path: str) -> Signature | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _private(directory: str) -> bool:
    """Whether only we may create or rename entries in ``directory``."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _load_at_lowest_priority(path: str, conn: Any) -> None:
    """The worker: nice itself, load ``path``, send the result (spawned, so nothing of the
    parent's state is shared)."""
    with contextlib.suppress(OSError):
        os.nice(ASIDE_NICE)
    try:
        from flight_profiler.report.loaders import load_one

        conn.send(load_one(path))
    finally:
        conn.close()


class _Aside:
    """One input loaded in a worker process (``Preloader.load_aside``)."""

    def __init__(self, path: str, sig: Signature) -> None:
        import multiprocessing

        self.sig = sig
        ctx = multiprocessing.get_context("spawn")  # not fork: the caller has threads
        self.conn, child = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=_load_at_lowest_priority, args=(path, child),
                                   name="flight_profiler-load-aside", daemon=True)
        try:
            self.process.start()
        finally:
            child.close()

    def unniced(self) -> bool:
        """Give the worker the normal priority back; False where that is not allowed."""
        pid = self.process.pid
        if pid is None:
            return False
        try:
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0))
        except ProcessLookupError:
            return True  # it is done already
        except OSError:
            return False
        return True

    def result(self, seconds: float) -> InputResult | None:
        """The worker's load, waited for up to ``seconds``; None if it failed or took longer."""
        try:
            if self.conn.poll(seconds):
                got: InputResult = self.conn.recv()
                return got
        except Exception:  # a worker that died sends nothing whole (EOFError, a cut pickle)
            return None
        finally:
            self.stop()
        return None

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.join(5.0)


class Preloader:
    """Report inputs loaded ahead of the report, by path."""

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[Signature, InputResult]] = {}
        self._behind: threading.Thread | None = None
        self._aside: dict[str, _Aside] = {}

    def load_aside(self, path: str) -> None:
        """Start loading ``path`` (the profile's trace) in a worker process at the lowest CPU
        priority, while phases that measure time may still run; ``load_behind`` gives it the
        normal priority back, ``taken`` collects it. Nothing happens where the file may not be
        loaded by name (a directory others may write) or the worker cannot start."""
        if path in self._aside or path in self._loaded:
            return
        if not _private(os.path.dirname(os.path.abspath(path))):
            return
        sig = _signature(path)
        if sig is None:
            return
        with contextlib.suppress(Exception):
            self._aside[path] = _Aside(path, sig)

    def load_behind(self, paths: list[str]) -> None:
        """Load those of ``paths`` not loaded yet, big ones included, in a thread of their own
        while the caller goes on (only while no phase that measures time runs); ``taken`` waits
        for it. A load that fails is left to the report. A worker started by ``load_aside``
        gets the normal priority back; one that may not is stopped and its file loaded here."""
        if self._behind is not None:
            return
        for path, aside in list(self._aside.items()):
            if not aside.unniced():
                aside.stop()
                del self._aside[path]
        todo = [p for p in paths if p not in self._aside]

        def load() -> None:
            with contextlib.suppress(Exception):
                self.warm(todo, float("inf"), big=True)

        self._behind = threading.Thread(target=load, name="flight_profiler-preload", daemon=True)
        self._behind.start()

    def warm(self, paths: list[str], seconds: float, big: bool = False) -> None:
        """Load those of ``paths`` not loaded yet, for about ``seconds`` (a load once started is
        finished: the report would spend that time anyway); with ``big``, those bigger than
        PRELOAD_MAX_BYTES too."""
        deadline = time.monotonic() + seconds
        from flight_profiler.report.loaders import load_one

        for path in paths:
            if time.monotonic() >= deadline:
                return
            if path in self._loaded or path in self._aside or not _private(os.path.dirname(os.path.abspath(path))):
                continue
            sig = _signature(path)
            if sig is None or (not big and sig[1] * (10 if path.endswith(".gz") else 1)
                               > PRELOAD_MAX_BYTES):
                continue
            self._loaded[path] = (sig, load_one(path))

    def close(self) -> None:
        """Stop the workers still loading (a diagnosis that ended early: a vanished target,
        Ctrl-C), so that none outlives it in a long-lived CLI (the interactive shell)."""
        for aside in self._aside.values():
            aside.stop()
        self._aside.clear()

    def taken(self, paths: list[str]) -> dict[str, InputResult]:
        """The loaded inputs among ``paths`` whose files are unchanged since; each is handed out
        once (the engine may annotate what it is given)."""
        if self._behind is not None:
            self._behind.join()
            self._behind = None
        for path, aside in list(self._aside.items()):
            del self._aside[path]
            result = aside.result(ASIDE_WAIT_S)
            if result is not None and path not in self._loaded:
                self._loaded[path] = (aside.sig, result)
        out: dict[str, InputResult] = {}
        for path in paths:
            entry = self._loaded.pop(path, None)
            if entry is not None and _signature(path) == entry[0]:
                out[path] = entry[1]
        return out
