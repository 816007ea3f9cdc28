"""The CLI side's one atomic writer: a file appears whole or not at all, never half-written.

Reports, diffs and the diagnosis' JSON files go through here. The agent keeps its own copy
(agent/atomic.py) because it must stay standard-library-only and self-contained in the target.

The CLI often runs as root writing into a directory another user can write (``diagnose --out``
handed to the target's user, a shared /tmp): every name in it can be swapped for a link between
two calls. So the directory is opened once, the temp file is created in it with
``O_EXCL|O_NOFOLLOW`` and written, synced and chmodded through its descriptor (never by name),
renamed into place relative to the directory's descriptor, and checked to be the very file
written. The destination must be a regular file or absent: a device node, FIFO, directory or
symlink there is refused (renaming over it would replace the node, not write to it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

_umask: int | None = None
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotRegularFile(OSError):
    """The destination exists and is not a regular file."""


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


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    return ("a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else
            "a FIFO" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a symbolic link" if stat.S_ISLNK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def write_text_atomic(path: str, text: str, mode: int | None = None) -> int:
    """Write ``text`` to ``path`` through a temp file + rename; returns the bytes written.

    The temp file lives in the destination directory so that the rename stays on one
    filesystem: a reader sees the old file or the new one, never a part. On any failure (disk
    full, interrupted, an empty text) the temp file is removed and ``path`` is left as it was.
    ``mode`` defaults to what ``open(path, "w")`` would give: the existing file's permissions,
    else 0o666 less the umask. Raises ``NotRegularFile`` (an OSError) when ``path`` is a device,
    FIFO, directory or symlink.
    """
    data = text.encode("utf-8")
    if not data:
        raise OSError(f"refusing to write an empty file to {path}")
    directory = os.path.dirname(os.path.abspath(path)) or "."
    name = os.path.basename(path)
    if not name:
        raise NotRegularFile(errno.EISDIR, "a directory, not a file name", path)
    dir_fd = os.open(directory, _DIR_FLAGS)
    try:
        try:
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and not stat.S_ISREG(old.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{kind_of(old.st_mode)}, not a regular file", path)
        if mode is None:
            mode = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_current_umask()
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                os.fchmod(fd, mode)
                os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                _check_placed(fd, dir_fd, name, path)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)  # unlink follows no link: only the name goes
            raise
    finally:
        os.close(dir_fd)
    return len(data)


def _check_placed(fd: int, dir_fd: int, name: str, path: str) -> None:
    """The name must now lead to the file we wrote: if someone swapped the temp name for
    something else before the rename, that thing is what got renamed into place; remove it."""
    mine = os.fstat(fd)
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
        if now is not None and not (stat.S_ISREG(now.st_mode) and now.st_uid == mine.st_uid):
            with contextlib.suppress(OSError):  # (a file of ours: another writer's, kept)
                os.unlink(name, dir_fd=dir_fd)
        raise OSError(errno.EAGAIN, "replaced while it was written (someone else writes in "
                      "that directory); nothing was written", path)
