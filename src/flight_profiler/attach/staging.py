"""Put the agent where the target can load it: its private directory, as the target sees it.

The CLI's own install may be unreadable to the target's user (root's venv) or invisible to it
(another mount namespace: a container), so the agent package and the helper library are copied
into /tmp/flight_profiler-<uid>/ under the target's root (/proc/PID/root), owned by the target's
user, in a directory named after their content hash (copied once per version).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass

from flight_profiler.agent import protocol
from flight_profiler.errors import PermissionDenied

_AGENT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent")


@dataclass
class Staged:
    pkg: str  # agent package directory, as the target sees it
    helper: str | None  # helper library, as the target sees it
    log: str  # agent log, as the target sees it


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


def ensure_private_dir(path: str, uid: int) -> None:
    """The agent's directory: created 0700 for ``uid``, or refused if someone else owns it."""
    try:
        os.mkdir(path, 0o700)
        if os.geteuid() == 0 and uid != 0:
            os.chown(path, uid, -1)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise PermissionDenied(
            f"{path} is not a private directory of uid {uid} (owner {st.st_uid}, "
            f"mode {oct(st.st_mode & 0o7777)}); refusing to use it",
            f"remove it if you did not create it: `sudo rm -rf {path}`",
        )


def private_dir(uid: int, root: str) -> str:
    """The target's private directory as we see it, created if needed, checked."""
    outer_dir = protocol.socket_dir(uid, root)
    if root != "/":
        # An absolute symlink inside /proc/PID/root resolves against OUR root: never follow a
        # /tmp that the target's filesystem made a symlink.
        tmp = os.path.dirname(outer_dir)
        if os.path.islink(tmp) or not os.path.isdir(tmp):
            raise PermissionDenied(f"{tmp} is not a plain directory; refusing to use it",
                                   "the target's /tmp must be a real directory")
    ensure_private_dir(outer_dir, uid)
    return outer_dir


def _chown_tree(path: str, uid: int) -> None:
    if os.geteuid() != 0 or uid == 0:
        return
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, uid, -1)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), uid, -1)


def stage(uid: int, ns_pid: int, root: str, helper: str | None) -> Staged:
    """Copy agent + helper into the target's private dir (once per content hash)."""
    inner_dir = protocol.socket_dir(uid)  # as the target sees it
    outer_dir = private_dir(uid, root)  # as we see it
    files = _agent_files()
    digest = _digest(files, helper)
    name = f"agent-{digest}"
    outer = os.path.join(outer_dir, name)
    if not os.path.isdir(outer):
        tmp = tempfile.mkdtemp(prefix=".staging-", dir=outer_dir)
        try:
            for rel in files:
                dest = os.path.join(tmp, "pkg", rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(os.path.join(_AGENT_DIR, rel), dest)
            if helper:
                shutil.copyfile(helper, os.path.join(tmp, "fp_inject.so"))
                os.chmod(os.path.join(tmp, "fp_inject.so"), 0o755)
            os.chmod(tmp, 0o700)
            _chown_tree(tmp, uid)
            try:
                os.rename(tmp, outer)
            except OSError:  # another CLI staged the same content meanwhile
                if not os.path.isdir(outer):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    inner = os.path.join(inner_dir, name)
    return Staged(
        pkg=os.path.join(inner, "pkg"),
        helper=os.path.join(inner, "fp_inject.so") if helper else None,
        log=protocol.log_path(ns_pid, uid),
    )
