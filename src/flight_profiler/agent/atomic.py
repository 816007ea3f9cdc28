"""Atomic file writes for the agent: a file appears whole or not at all, never empty."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Callable


def write_atomic(path: str, write: Callable[[IO[bytes]], None], mode: int = 0o600) -> int:
    """Write ``path`` through ``write(fileobj)`` via a temp file + rename; returns its size.

    The temp file lives in the destination directory so that ``os.replace`` is a rename on one
    filesystem. A failure, or a writer that wrote nothing, leaves no file behind.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".fp-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        size = os.path.getsize(tmp)
        if size == 0:
            raise OSError(f"refusing to write an empty file to {path}")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        return size
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
