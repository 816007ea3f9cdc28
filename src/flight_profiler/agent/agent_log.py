"""The agent's log: one regular file in its private directory, or nowhere.

The agent lives in someone else's process: its log must never reach the target's stderr and
never block one of its threads. The standard file handlers do both wrong: a failing write
prints ``--- Logging error ---`` and a traceback to ``sys.stderr`` (``logging.raiseExceptions``
is on by default), and a FIFO at the log's name blocks the opening thread until a reader comes
(a detach hung for 40 s; on the attach path it would be the target's main thread). So the file
is opened once, ``O_NOFOLLOW | O_NONBLOCK``, and kept only if fstat says it is a regular file
of ours; every write goes through that descriptor, and any failure is silent. Anything else at
the name (a FIFO, a device, a directory, a link, someone else's file) means no log at all: a
NullHandler, so that logging's last-resort handler (stderr too) never runs either.

The agent's own lines (server, registry) are written by :data:`LOG` without importing
``logging`` (~10 ms in a target that has not imported it, on the first command's path: issue
23), formatted as ``logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s")``
would. Modules that use ``logging.getLogger("flight_profiler.agent")`` (the triggers) reach the
same file through log_bridge.py, bound by :func:`use_logging` as soon as ``logging`` is imported
or a command that may log through it is about to load (registry.py); never later, or their lines
would find a logger without a handler and logging's last resort would print them on stderr.

Bounded: past ``MAX_BYTES`` the file is renamed to ``NAME.1`` (the one kept rotation) and a new
one opened the same careful way.

A job with mixed uids keeps its log in root's directory (docs/attach.md): opening and rotating
then run with the file-system identity of that directory's owner (``credentials.as_home``), and
the file must be that owner's. Writes go through the descriptor and need no identity.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import time

from . import credentials

MAX_BYTES = 1 << 20  # the log rotates once past this: at most twice this on disk
_FLAGS = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
          | getattr(os, "O_CLOEXEC", 0))


def open_log(path: str, home: int | None = None) -> int | None:
    """A descriptor appending to ``path`` if it is (or is now created as) a regular file of
    ``home`` (default: this process's effective uid); None otherwise. Never blocks, never
    follows a link."""
    owner = os.geteuid() if home is None else home
    try:
        if home is None:
            fd = os.open(path, _FLAGS, 0o600)
        else:
            fd = credentials.as_home(home, lambda: os.open(path, _FLAGS, 0o600))
    except Exception:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == owner:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


class AgentLog:
    """Writes lines to one descriptor; says nothing when it cannot (no descriptor: nowhere)."""

    def __init__(self) -> None:
        self.path = ""
        self.home: int | None = None
        self.fd: int | None = None
        self.size = 0
        # one writer at a time: a rotation must not close a descriptor another thread is
        # writing through (its number could be reused meanwhile)
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()

    def open(self, path: str, home: int | None = None) -> None:
        """Write to ``path`` from now on (see the module's docstring), or nowhere at all."""
        fd = open_log(path, home)
        try:
            size = os.fstat(fd).st_size if fd is not None else 0
        except OSError:
            size = 0
        with self._lock:
            self._close()
            self.path, self.home, self.fd, self.size = path, home, fd, size

    def write(self, line: str) -> None:
        """Append ``line`` and a newline, rotating first past MAX_BYTES."""
        try:
            data = (line + "\n").encode("utf-8", "replace")
            with self._lock:
                if self.fd is not None and self.size + len(data) > MAX_BYTES:
                    self._rotate()
                fd = self.fd
                if fd is None:
                    return
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                self.size += len(data)
        except BaseException:  # a log line is never worth an error in the target
            pass

    def _line(self, level: str, msg: str, args: tuple[object, ...], trace: bool = False) -> None:
        if self.fd is None:
            return
        try:
            now = time.time()
            text = msg % args if args else msg
            if trace:
                import traceback  # only for a failure: it costs ~5 ms to import

                text += "\n" + traceback.format_exc().rstrip("\n")
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            self.write(f"{stamp},{int(now * 1000) % 1000:03d} {os.getpid()} {level} {text}")
        except BaseException:
            pass

    def info(self, msg: str, *args: object) -> None:
        self._line("INFO", msg, args)

    def warning(self, msg: str, *args: object) -> None:
        self._line("WARNING", msg, args)

    def error(self, msg: str, *args: object) -> None:
        self._line("ERROR", msg, args)

    def exception(self, msg: str, *args: object) -> None:
        """An ERROR line with the traceback of the exception being handled."""
        self._line("ERROR", msg, args, trace=True)

    def _rotate(self) -> None:
        old, self.fd = self.fd, None
        if old is not None:
            os.close(old)
        with contextlib.suppress(Exception):
            path = self.path
            if self.home is None:
                os.replace(path, path + ".1")
            else:
                credentials.as_home(self.home, lambda: os.replace(path, path + ".1"))
        self.fd = open_log(self.path, self.home)
        self.size = 0

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


LOG = AgentLog()  # the agent's log: server.py and registry.py write through it
_bound = False  # whether logging's "flight_profiler.agent" logger writes through LOG


def setup(path: str, home: int | None = None) -> None:
    """Send the agent's log to ``path``, or nowhere at all; ``home``: the uid owning the log's
    directory, when the process does not act as it (a mixed-uid job)."""
    LOG.open(path, home)
    if "logging" in sys.modules:  # the target has it (any torch job): binding costs nothing
        use_logging()


def use_logging() -> None:
    """Bind logging's "flight_profiler.agent" logger to :data:`LOG` (importing logging), once."""
    global _bound
    if not _bound:
        from . import log_bridge

        log_bridge.bind(LOG)
        _bound = True
