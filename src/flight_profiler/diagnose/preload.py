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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flight_profiler.report.models import InputResult

# A file bigger than this (decoded; gzip shrinks traces ~10x) is left to the report: it takes
# seconds, longer than a wait, and the engine loads big ones in worker processes, in parallel.
PRELOAD_MAX_BYTES = 12 << 20

Signature = tuple[int, int, int]


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


class Preloader:
    """Report inputs loaded ahead of the report, by path."""

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[Signature, InputResult]] = {}
        self._behind: threading.Thread | None = None

    def load_behind(self, paths: list[str]) -> None:
        """Load those of ``paths`` not loaded yet, big ones included, in a thread of their own
        while the caller goes on (only while no phase that measures time runs); ``taken`` waits
        for it. A load that fails is left to the report."""
        if self._behind is not None:
            return
        todo = list(paths)

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
            if path in self._loaded or not _private(os.path.dirname(os.path.abspath(path))):
                continue
            sig = _signature(path)
            if sig is None or (not big and sig[1] * (10 if path.endswith(".gz") else 1)
                               > PRELOAD_MAX_BYTES):
                continue
            self._loaded[path] = (sig, load_one(path))

    def taken(self, paths: list[str]) -> dict[str, InputResult]:
        """The loaded inputs among ``paths`` whose files are unchanged since; each is handed out
        once (the engine may annotate what it is given)."""
        if self._behind is not None:
            self._behind.join()
            self._behind = None
        out: dict[str, InputResult] = {}
        for path in paths:
            entry = self._loaded.pop(path, None)
            if entry is not None and _signature(path) == entry[0]:
                out[path] = entry[1]
        return out
