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

Bounded: past ``MAX_BYTES`` the file is renamed to ``NAME.1`` (the one kept rotation) and a new
one opened the same careful way.

A job with mixed uids keeps its log in root's directory (docs/attach.md): opening and rotating
then run with the file-system identity of that directory's owner (``credentials.as_home``), and
the file must be that owner's. Writes go through the descriptor and need no identity.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat

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


class AgentLogHandler(logging.Handler):
    """Writes formatted records to one descriptor; says nothing when it cannot."""

    def __init__(self, path: str, fd: int, home: int | None = None) -> None:
        super().__init__()
        self.path = path
        self.home = home
        self.fd: int | None = fd
        try:
            self.size = os.fstat(fd).st_size
        except OSError:
            self.size = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            if self.size + len(data) > MAX_BYTES:
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

    def _rotate(self) -> None:
        old, self.fd = self.fd, None
        if old is not None:
            os.close(old)
        with contextlib.suppress(Exception):
            if self.home is None:
                os.replace(self.path, self.path + ".1")
            else:
                credentials.as_home(self.home, lambda: os.replace(self.path, self.path + ".1"))
        self.fd = open_log(self.path, self.home)
        self.size = 0

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # the default prints to the target's stderr

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        super().close()


def setup(log: logging.Logger, path: str, home: int | None = None) -> None:
    """Send ``log`` to ``path`` (see the module's docstring), or nowhere at all; ``home``: the
    uid owning the log's directory, when the process does not act as it (a mixed-uid job)."""
    log.propagate = False  # never reach the target's own handlers (they may print)
    log.setLevel(logging.INFO)
    for old in list(log.handlers):
        log.removeHandler(old)
        old.close()
    fd = open_log(path, home)
    handler: logging.Handler
    if fd is None:
        handler = logging.NullHandler()
    else:
        handler = AgentLogHandler(path, fd, home)
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    log.addHandler(handler)
