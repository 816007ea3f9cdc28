"""The one owner of the directories the CLI works in under the target's /tmp, seen from the CLI.

The target's private directory, /tmp/flight_profiler-<uid>, belongs to the TARGET's user, and the
CLI often runs as root: every path name inside it is under that user's control (a symlink
planted at the lock, a directory at a socket's name). So the directory is opened once, without
following links, checked with fstat, and everything inside it (attach lock, agent log, socket) is
reached relative to that descriptor: O_NOFOLLOW on every open, fchown/fchmod on descriptors,
never a path-based chown or chmod.

Root's staged agent copies live apart, in /tmp/flight_profiler-code (``open_code_dir``): owned by
root, 0755, so that every target can read the code root injects and no one else can write it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator

from flight_profiler.agent import protocol
from flight_profiler.errors import AttachTimeout, PermissionDenied, cannot_stage

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under a file's name must not hang the CLI in open().
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
CODE_DIR = "flight_profiler-code"  # root's staged agent copies, under the target's /tmp
# Removing a tree holds at most this many directories open; a deeper one is moved up to the
# top level and removed after (a 1,500-deep tree costs no recursion and no 1,500 descriptors).
_MAX_DEPTH = 32
_REMOVE_BUDGET = 200_000  # entries one removal may visit; the rest waits for a later sweep
# What a full or read-only /tmp (or a foreign user namespace) answers: said in one line.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EOVERFLOW, errno.EMLINK)


def _refuse(path: str, why: str) -> PermissionDenied:
    return PermissionDenied(f"{path}: {why}; refusing to use it",
                            f"remove it if you did not create it: `sudo rm -rf {path}`")


class AgentDir:
    """An open, checked descriptor on the target's private directory."""

    def __init__(self, fd: int, uid: int, path: str, inner: str) -> None:
        self.fd = fd
        self.uid = uid
        self.path = path  # as we see it (for messages)
        self.inner = inner  # as the target sees it (for the bootstrap)

    @classmethod
    def open(cls, uid: int, root: str = "/") -> AgentDir:
        """Open (creating it 0700 for ``uid`` if needed) and check the private directory."""
        return cls._open(protocol.socket_dir(uid), root, uid, private=True)

    @classmethod
    def open_code_dir(cls, root: str = "/") -> AgentDir:
        """Open (creating it if needed) root's directory of staged agent copies: root's, 0755
        (every target may read it), written by no one else."""
        return cls._open(os.path.join("/tmp", CODE_DIR), root, 0, private=False)

    @classmethod
    def _open(cls, inner: str, root: str, uid: int, private: bool) -> AgentDir:
        path = os.path.join(root, inner.lstrip("/"))
        name = os.path.basename(inner)
        # Walk root -> tmp -> ours by descriptors: a symlinked /tmp inside a container would
        # otherwise resolve against OUR root.
        root_fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        # our own /tmp may be a symlink (it is root's); a container's must not be
        tmp_flags = _DIR_FLAGS & ~os.O_NOFOLLOW if root == "/" else _DIR_FLAGS
        try:
            try:
                tmp_fd = os.open("tmp", tmp_flags, dir_fd=root_fd)
            except OSError as exc:
                raise _refuse(os.path.dirname(path), f"not a plain directory ({exc.strerror})") from None
        finally:
            os.close(root_fd)
        me = os.geteuid()
        try:
            created = False
            if me in (0, uid):  # never squat another user's directory name
                try:
                    os.mkdir(name, 0o700, dir_fd=tmp_fd)
                    created = True
                except FileExistsError:
                    pass
                except OSError as exc:
                    if exc.errno in _NO_ROOM:
                        raise cannot_stage(path, exc) from None
                    raise
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=tmp_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(path, "not a directory (a symlink?)") from None
                if exc.errno in (errno.EACCES, errno.ENOENT) and me not in (0, uid):
                    raise PermissionDenied(
                        f"the agent directory of uid {uid} is not yours (you are uid {me})",
                        "run as the target's user or with sudo") from None
                raise
        finally:
            os.close(tmp_fd)
        try:
            st = os.fstat(fd)
            if created and st.st_uid == me and st.st_uid != uid and me == 0:
                os.fchown(fd, uid, -1)
                st = os.fstat(fd)
            if created and not private:
                os.fchmod(fd, 0o755)  # every target reads its agent from here
                st = os.fstat(fd)
            if st.st_uid != uid:
                raise _refuse(path, f"owned by uid {st.st_uid}, not {uid}")
            if stat.S_IMODE(st.st_mode) & (0o077 if private else 0o022):
                what = "lets other users in" if private else "lets other users write in it"
                raise _refuse(path, f"mode {oct(stat.S_IMODE(st.st_mode))} {what}")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, uid, path, inner)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> AgentDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names inside ------------------------------------------------------------------------
    def via_fd(self, name: str) -> str:
        """A path to ``name`` that resolves the directory through our descriptor (for connect)."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def open_file(self, name: str, flags: int, mode: int = 0o600) -> int:
        """Open a regular file inside, never following a link; refuse anything else."""
        try:
            fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise _refuse(os.path.join(self.path, name),
                              f"not a regular file ({exc.strerror})") from None
            if exc.errno in _NO_ROOM:
                raise cannot_stage(self.path, exc) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(os.path.join(self.path, name), "not a regular file")
            if st.st_nlink > 1:  # a hard link to a file elsewhere (e.g. one of root's)
                raise _refuse(os.path.join(self.path, name), "a hard link to another file")
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read_from(self, name: str, offset: int, limit: int = 1 << 20) -> bytes:
        """Up to ``limit`` bytes of ``name`` from ``offset`` (b"" if absent or not a file)."""
        try:
            fd = self.open_file(name, os.O_RDONLY)
        except (OSError, PermissionDenied):
            return b""
        try:
            return os.pread(fd, limit, offset)
        finally:
            os.close(fd)

    def size(self, name: str) -> int:
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def unlink(self, name: str) -> None:
        """Remove ``name`` inside, whatever it is (a directory planted under a file's name
        goes with everything in it); never follows a link."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            self.remove_tree(name)
        except OSError as exc:
            if exc.errno != errno.EPERM:  # EPERM: Linux's answer for a directory too
                raise
            self.remove_tree(name)

    def remove_tree(self, name: str) -> bool:
        """Remove ``name`` inside and everything under it, never following a link, without
        recursion and holding at most ``_MAX_DEPTH`` descriptors: a directory deeper than that
        is moved up next to ``name`` and removed after. Visits at most ``_REMOVE_BUDGET``
        entries; returns False if some are left (a later sweep goes on)."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)
            return True
        budget = _REMOVE_BUDGET
        complete = True
        pending = [name]
        while pending:
            top = pending.pop()
            chain: list[tuple[int, str]] = []  # open directories, top first, with their names
            try:
                chain.append((os.open(top, _DIR_FLAGS, dir_fd=self.fd), top))
                while chain:
                    cur = chain[-1][0]
                    child = None
                    with os.scandir(cur) as entries:
                        for entry in entries:
                            budget -= 1
                            if budget < 0:
                                return False
                            if not entry.is_dir(follow_symlinks=False):
                                with contextlib.suppress(FileNotFoundError):
                                    os.unlink(entry.name, dir_fd=cur)
                            elif len(chain) >= _MAX_DEPTH:
                                moved = f".staging-deep-{os.urandom(8).hex()}"
                                os.rename(entry.name, moved, src_dir_fd=cur, dst_dir_fd=self.fd)
                                pending.append(moved)
                            else:
                                child = entry.name
                                break
                    if child is not None:
                        chain.append((os.open(child, _DIR_FLAGS, dir_fd=cur), child))
                        continue
                    fd, done = chain.pop()  # empty now
                    os.close(fd)
                    os.rmdir(done, dir_fd=chain[-1][0] if chain else self.fd)
            except FileNotFoundError:
                pass  # someone else removed it meanwhile
            except OSError:
                complete = False  # e.g. a directory its owner made unreadable: left as it is
            finally:
                for fd, _ in chain:
                    os.close(fd)
        return complete

    # -- the attach lock -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str, deadline: float, what: str) -> Iterator[None]:
        """Hold an exclusive flock on ``name`` inside; the file is removed when released.

        Removing a lock file is safe only while holding it, and a waiter may have opened the
        file just before it went: after each acquisition check that the name still leads to
        the file we locked, else start again on the new one.
        """
        while True:
            fd = self.open_file(name, os.O_RDWR | os.O_CREAT)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise AttachTimeout(f"another flight_profiler is attaching to {what}",
                                                "retry when it is done") from None
                        time.sleep(0.02)
                mine = os.fstat(fd)
                try:
                    now = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                    continue  # the holder before us removed it: lock the current one
                try:
                    yield
                finally:
                    self.unlink(name)
                return
            finally:
                os.close(fd)
