"""Put the agent where the target can load it: its private directory, as the target sees it.

The CLI's own install may be unreadable to the target's user (root's venv) or invisible to it
(another mount namespace: a container), so the agent package (and, for the gdb injector, the
helper library) is copied into /tmp/flight_profiler-<uid>/ under the target's root
(/proc/PID/root), owned by the target's user, in a directory named after its content hash
(copied once per version).

That directory is the target user's: when root stages, every name in it may be swapped for a
link between two calls. The copy is therefore built inside a fresh directory that stays root's
(0700) until complete, reached only through descriptors opened with O_NOFOLLOW, handed over
with fchown on those descriptors, and renamed into place (rename follows no link).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass

from flight_profiler.agent import protocol
from flight_profiler.attach.agent_dir import AgentDir
from flight_profiler.errors import PermissionDenied

_AGENT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
STAGED_PREFIX = "agent-"
IN_USE = "in-use"  # every running agent holds a shared flock on this file of its copy
# A copy staged this recently may be about to be loaded by an attach to another process (whose
# agent does not hold it yet): only older unheld copies are removed.
SETTLE_SECONDS = 600.0


@dataclass
class Staged:
    pkg: str  # agent package directory, as the target sees it
    helper: str | None  # helper library, as the target sees it
    log: str  # agent log, as the target sees it
    name: str = ""  # the staged directory's name inside the private directory
    sock: str = ""  # the agent's socket name inside the private directory


def _agent_files() -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(_AGENT_DIR):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, name), _AGENT_DIR))
    return out


def _digest(files: list[str], helper: str | None) -> str:
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode())
        with open(os.path.join(_AGENT_DIR, rel), "rb") as f:
            h.update(f.read())
    if helper:
        with open(helper, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def private_dir(uid: int, root: str) -> str:
    """The target's private directory as we see it, created if needed, checked."""
    with AgentDir.open(uid, root) as directory:
        return directory.path


def _hand_over(fd: int, uid: int) -> None:
    if os.geteuid() == 0 and uid != 0:
        os.fchown(fd, uid, -1)


def _copy_into(dir_fd: int, name: str, source: str, mode: int, uid: int) -> None:
    with open(source, "rb") as src:
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(os.dup(fd), "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.fchmod(fd, mode)
            _hand_over(fd, uid)
        finally:
            os.close(fd)


def _subdir(dir_fd: int, name: str, uid: int) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    _hand_over(fd, uid)
    return fd


def _build(top_fd: int, files: list[str], helper: str | None, uid: int) -> None:
    opened: dict[str, int] = {"": _subdir(top_fd, "pkg", uid)}
    try:
        for rel in files:
            parent = os.path.dirname(rel)
            if parent not in opened:
                # os.walk lists parents first, so the parent's parent is already open
                opened[parent] = _subdir(opened[os.path.dirname(parent)],
                                         os.path.basename(parent), uid)
            _copy_into(opened[parent], os.path.basename(rel), os.path.join(_AGENT_DIR, rel),
                       0o600, uid)
    finally:
        for fd in opened.values():
            os.close(fd)
    if helper:
        _copy_into(top_fd, "fp_inject.so", helper, 0o700, uid)
    fd = os.open(IN_USE, _NEW_FILE, 0o600, dir_fd=top_fd)
    try:
        _hand_over(fd, uid)
    finally:
        os.close(fd)


def _is_staged_dir(directory: AgentDir, name: str, uid: int) -> bool:
    try:
        st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def stage(uid: int, ns_pid: int, root: str, helper: str | None,
          pid_ns: int | None = None, directory: AgentDir | None = None) -> Staged:
    """Copy agent (+ helper) into the target's private dir (once per content hash)."""
    own = directory is None
    agent_dir = AgentDir.open(uid, root) if directory is None else directory
    try:
        files = _agent_files()
        name = STAGED_PREFIX + _digest(files, helper)
        if _is_staged_dir(agent_dir, name, uid):
            # a fresh ctime tells other CLIs' cleanup that this copy is about to be loaded
            with contextlib.suppress(OSError):
                os.utime(name, dir_fd=agent_dir.fd, follow_symlinks=False)
        else:
            _stage_new(agent_dir, name, files, helper, uid)
        remove_unused(agent_dir, name)
        inner = os.path.join(agent_dir.inner, name)
        return Staged(
            pkg=os.path.join(inner, "pkg"),
            helper=os.path.join(inner, "fp_inject.so") if helper else None,
            log=os.path.join(agent_dir.inner, protocol.log_name(ns_pid, pid_ns)),
            name=name, sock=protocol.socket_name(ns_pid, pid_ns),
        )
    finally:
        if own:
            agent_dir.close()


def _replaced(agent_dir: AgentDir, name: str) -> PermissionDenied:
    return PermissionDenied(
        f"{os.path.join(agent_dir.path, name)} was replaced while the agent was staged "
        "(someone else writes in the target's private directory); nothing was staged",
        f"retry; if it happens again, find who writes in {agent_dir.path}")


def _open_new_dir(agent_dir: AgentDir, tmp: str) -> int:
    """The directory we just made, or PermissionDenied if the name now leads elsewhere."""
    try:
        top_fd = os.open(tmp, _DIR_FLAGS, dir_fd=agent_dir.fd)
    except OSError:  # ELOOP: a symlink took its place; ENOENT: renamed away
        raise _replaced(agent_dir, tmp) from None
    st = os.fstat(top_fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        os.close(top_fd)
        raise _replaced(agent_dir, tmp)
    return top_fd


def _stage_new(agent_dir: AgentDir, name: str, files: list[str], helper: str | None,
               uid: int) -> None:
    tmp = f".staging-{secrets.token_hex(8)}"
    os.mkdir(tmp, 0o700, dir_fd=agent_dir.fd)
    try:
        top_fd = _open_new_dir(agent_dir, tmp)
        try:
            _build(top_fd, files, helper, uid)
            _hand_over(top_fd, uid)  # last: until now no one else could enter it
            try:
                os.rename(tmp, name, src_dir_fd=agent_dir.fd, dst_dir_fd=agent_dir.fd)
            except OSError:  # another CLI staged the same content meanwhile
                if not _is_staged_dir(agent_dir, name, uid):
                    raise
                return
            mine = os.fstat(top_fd)
            try:
                now = os.stat(name, dir_fd=agent_dir.fd, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                # what we renamed into place was not our copy (ours was moved away meanwhile)
                remove_tree(agent_dir, name)
                raise _replaced(agent_dir, tmp)
        finally:
            os.close(top_fd)
    finally:
        remove_tree(agent_dir, tmp)


def remove_tree(agent_dir: AgentDir, name: str) -> None:
    """Remove ``name`` inside without following any link in it (shutil's fd-based rmtree)."""
    try:
        st = os.stat(name, dir_fd=agent_dir.fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        agent_dir.unlink(name)
        return
    # the /proc/self/fd path pins the parent; rmtree itself opens each level with O_NOFOLLOW
    shutil.rmtree(agent_dir.via_fd(name), ignore_errors=True)


def remove_unused(agent_dir: AgentDir, keep: str) -> list[str]:
    """Remove staged copies other than ``keep`` that no running agent holds; their names."""
    removed = []
    for entry in os.listdir(agent_dir.fd):
        if entry == keep or not entry.startswith(STAGED_PREFIX) or "." in entry:
            continue
        try:
            st = os.stat(entry, dir_fd=agent_dir.fd, follow_symlinks=False)
        except OSError:
            continue
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != agent_dir.uid
                or time.time() - st.st_ctime < SETTLE_SECONDS):
            continue
        try:
            dir_fd = os.open(entry, _DIR_FLAGS, dir_fd=agent_dir.fd)
        except OSError:
            continue
        try:
            try:
                fd = os.open(IN_USE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                             dir_fd=dir_fd)
            except OSError:
                continue  # staged by a version without the marker: cannot tell, keep it
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # an agent runs from it
                remove_tree(agent_dir, entry)
                removed.append(entry)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
    return removed
