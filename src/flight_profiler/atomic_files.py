"""The CLI side's one atomic writer: a file appears whole or not at all, never half-written.

Reports, diffs and the diagnosis' JSON files go through here. The agent keeps its own copy
(agent/atomic.py) because it must stay standard-library-only and self-contained in the target.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

_umask: int | None = None


def _current_umask() -> int:
    """The process umask, read without changing it (os.umask() would race other threads)."""
    global _umask
    if _umask is None:
        try:
            with open("/proc/self/status", encoding="ascii") as fh:
                line = next(x for x in fh if x.startswith("Umask:"))
            _umask = int(line.split()[1], 8)
        except (OSError, StopIteration, ValueError, IndexError):
            _umask = 0o022
    return _umask


def write_text_atomic(path: str, text: str, mode: int | None = None) -> int:
    """Write ``text`` to ``path`` through a temp file + rename; returns the bytes written.

    The temp file lives in the destination directory so that ``os.replace`` is a rename on one
    filesystem: a reader sees the old file or the new one, never a part. On any failure (disk
    full, interrupted, an empty text) the temp file is removed and ``path`` is left as it was.
    ``mode`` defaults to what ``open(path, "w")`` would give (0o666 less the umask), so that
    users keep the permissions they had before writes became atomic.
    """
    data = text.encode("utf-8")
    if not data:
        raise OSError(f"refusing to write an empty file to {path}")
    directory = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(data)
