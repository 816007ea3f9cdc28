"""Put the agent where the target can load it, as code only the CLI's user can have written.

The CLI's own install may be unreadable to the target's user (root's venv) or invisible to it
(another mount namespace: a container), so the agent package (and, for the gdb injector, the
helper library) is copied under the target's root (/proc/PID/root), into a directory named after
its content hash and the CLI's bytecode cache tag (copied once per version), with the CLI's own
bytecode of each module in the ``__pycache__`` the CLI makes (a checked-hash .pyc: the target
checks it against the verified source; a target of another version compiles the source):

- by root, into /tmp/flight_profiler-code (``AgentDir.open_code_dir``): root's, directories
  0755, files 0644: every target can read it, no other user can write it. Root never stages
  into a directory another user can write: a job of that user's may be a root job that dropped
  its effective uid for a while (seteuid), and must never run code that user planted.
- by any other user, into their own private directory (their own processes are the only ones
  they can attach to).

A copy is reused only if it verifies: every directory and file in it belongs to the CLI's user
and no one else can write it, and every file of the agent hashes, read through the descriptor
that was checked, to what this CLI would copy. A copy that does not verify is removed and staged
afresh. A new copy is built in a fresh 0700 ``.staging-*`` directory through descriptors only
(mkdirat, openat(O_EXCL|O_NOFOLLOW), fchmod), opened up last, renamed into place (rename follows
no link) and checked to be the very directory built.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import sys
import time

from flight_profiler.agent import protocol
from flight_profiler.attach.agent_dir import AgentDir
from flight_profiler.errors import PermissionDenied, cannot_stage
from flight_profiler.records import Record

_AGENT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
STAGED_PREFIX = "agent-"
IN_USE = "in-use"  # every running agent holds a shared flock on this file of its copy
HELPER = "fp_inject.so"
PYCACHE = "__pycache__"  # made by us: a target's interpreter must not make it (with its umask)
# A copy staged this recently may be about to be loaded by an attach to another process (whose
# agent does not hold it yet): only older unheld copies are removed.
SETTLE_SECONDS = 600.0
_MAX_ENTRIES = 4096  # a copy is ~50 files (and their .pyc): more does not verify


class Staged(Record):
    """Where the agent was staged (records.py says why it is not a dataclass)."""

    FIELDS = ("pkg", "helper", "log", "name", "sock")

    def __init__(self, pkg: str, helper: str | None, log: str, name: str = "",
                 sock: str = "") -> None:
        self.pkg = pkg  # agent package directory, as the target sees it
        self.helper = helper  # helper library, as the target sees it
        self.log = log  # agent log, as the target sees it
        self.name = name  # the staged copy's directory name inside its staging directory
        self.sock = sock  # the agent's socket name inside the private directory


class Manifest(Record):
    """What a copy of this CLI's agent holds: relative path -> sha256 of its content."""

    FIELDS = ("files", "helper", "hashes", "name")

    def __init__(self, files: list[str], helper: str | None, hashes: dict[str, str],
                 name: str) -> None:
        self.files = files  # the agent's .py files, relative to the package
        self.helper = helper  # the helper library to copy beside the package
        self.hashes = hashes  # every regular file the copy must hold, relative to the copy
        self.name = name  # the copy's directory name (its content hash)


def _agent_files() -> list[str]:
    out = []
    skip = len(_AGENT_DIR) + 1  # os.walk's paths start with it (relpath: two abspath each)
    for dirpath, dirnames, filenames in os.walk(_AGENT_DIR):
        dirnames[:] = sorted(d for d in dirnames if d != PYCACHE)
        for name in sorted(filenames):
            if name.endswith(".py"):
                out.append(os.path.join(dirpath, name)[skip:])
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def manifest(helper: str | None) -> Manifest:
    files = _agent_files()
    h = hashlib.sha256()
    # A copy holds this interpreter's bytecode beside the source (_bytecode): one copy per
    # cache tag, so that a target of the CLI's version always finds it there
    h.update(f"bytecode {sys.implementation.cache_tag}\0".encode())
    hashes: dict[str, str] = {}
    for rel in files:
        data = _read(os.path.join(_AGENT_DIR, rel))
        h.update(rel.encode())
        h.update(data)
        hashes[os.path.join("pkg", rel)] = hashlib.sha256(data).hexdigest()
    if helper:
        data = _read(helper)
        h.update(data)
        hashes[HELPER] = hashlib.sha256(data).hexdigest()
    hashes[IN_USE] = hashlib.sha256(b"").hexdigest()
    return Manifest(files, helper, hashes, STAGED_PREFIX + h.hexdigest()[:16])


def _digest(files: list[str], helper: str | None) -> str:
    """The content hash naming a copy (kept for callers that name copies themselves)."""
    return manifest(helper).name[len(STAGED_PREFIX):]


def private_dir(uid: int, root: str) -> str:
    """The target's private directory as we see it, created if needed, checked."""
    with AgentDir.open(uid, root) as directory:
        return directory.path


def code_dir(root: str, home: AgentDir | None = None) -> AgentDir:
    """Where this CLI stages: root's code directory for root, else the user's own private
    directory (``home`` when it is that one already)."""
    me = os.geteuid()
    if me == 0:
        return AgentDir.open_code_dir(root)
    if home is not None and home.uid == me:
        return AgentDir(os.dup(home.fd), home.uid, home.path, home.inner)
    return AgentDir.open(me, root)


def stage(uid: int, ns_pid: int, root: str, helper: str | None,
          pid_ns: int | None = None, directory: AgentDir | None = None) -> Staged:
    """Copy agent (+ helper) where the target can read it (once per content hash); ``uid`` is
    the agent's home (``protocol.home_uid``): whose private directory holds its socket and log,
    ``directory`` that directory if the caller holds it open."""
    try:
        with code_dir(root, directory) as code:
            want = manifest(helper)
            if verified(code, want.name, want):
                # a fresh ctime tells other CLIs' cleanup that this copy is about to be loaded
                with contextlib.suppress(OSError):
                    os.utime(want.name, dir_fd=code.fd, follow_symlinks=False)
            else:
                code.remove_tree(want.name)  # corrupt, tampered with, or not a directory
                _stage_new(code, want)
            remove_unused(code, want.name)
            inner = os.path.join(code.inner, want.name)
    except OSError as exc:
        raise cannot_stage(os.path.join(root, "tmp"), exc) from None
    return Staged(
        pkg=os.path.join(inner, "pkg"),
        helper=os.path.join(inner, HELPER) if helper else None,
        log=protocol.log_path(ns_pid, uid, "/", pid_ns),
        name=want.name, sock=protocol.socket_name(ns_pid, pid_ns),
    )


# -- verifying a copy ---------------------------------------------------------------------------
def _ours(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not stat.S_IMODE(st.st_mode) & 0o022


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def verified(directory: AgentDir, name: str, want: Manifest) -> bool:
    """Whether ``name`` is a copy this CLI would make: walked through descriptors opened
    without following links, every directory and file ours and writable by no one else, every
    expected file there and hashing right (read through the checked descriptor)."""
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=directory.fd)
    except OSError:
        return False
    stack = [(top, "")]
    seen: set[str] = set()
    entries = 0
    try:
        while stack:
            fd, rel = stack[-1]
            stack.pop()
            try:
                if not _ours(os.fstat(fd)):
                    return False
                with os.scandir(fd) as it:
                    for entry in it:
                        entries += 1
                        if entries > _MAX_ENTRIES:
                            return False
                        path = os.path.join(rel, entry.name)
                        if entry.is_dir(follow_symlinks=False):
                            stack.append((os.open(entry.name, _DIR_FLAGS, dir_fd=fd), path))
                            continue
                        if path not in want.hashes:  # a .pyc: checked, never read
                            st = entry.stat(follow_symlinks=False)  # fstatat, no link followed
                            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or not _ours(st):
                                return False
                            continue
                        ffd = os.open(entry.name, _READ_FLAGS, dir_fd=fd)
                        try:
                            st = os.fstat(ffd)
                            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or not _ours(st):
                                return False
                            if _hash_fd(ffd) != want.hashes[path]:
                                return False
                            seen.add(path)
                        finally:
                            os.close(ffd)
            finally:
                os.close(fd)
    except OSError:
        return False
    finally:
        for fd, _ in stack:
            os.close(fd)
    return seen == set(want.hashes)


# -- building a copy ----------------------------------------------------------------------------
def _copy_into(dir_fd: int, name: str, source: str, mode: int) -> bytes:
    data = _read(source)
    _write_new(dir_fd, name, data, mode)
    return data


def _write_new(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _bytecode(source: bytes, name: str) -> tuple[str, bytes] | None:
    """This interpreter's bytecode of one agent module: the .pyc name in ``__pycache__`` and a
    checked-hash .pyc (PEP 552), or None where it has no cache tag or cannot compile it.

    A target of the same version loads it instead of compiling the module on every attach (the
    target cannot write ``__pycache__`` itself: root's, or PYTHONDONTWRITEBYTECODE): ~35 ms of
    the first command (issue 23). Its interpreter checks the embedded hash of the source (the
    verified .py beside it) at each import and compiles the source when they differ; another
    version sees another magic number or cache tag and compiles, as without it.
    """
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    import importlib.util  # only when a copy is built (once per version of the agent)
    import marshal

    try:
        code = compile(source, name, "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError):
        return None
    flags = (0b11).to_bytes(4, "little")  # hash-based, checked
    header = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
    return f"{name[:-len('.py')]}.{tag}.pyc", header + marshal.dumps(code)


def _subdir(dir_fd: int, name: str) -> int:
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        if name != PYCACHE:
            os.close(_subdir(fd, PYCACHE))
        os.fchmod(fd, 0o755)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _build(top_fd: int, want: Manifest) -> None:
    opened: dict[str, int] = {"": _subdir(top_fd, "pkg")}
    caches: dict[str, int] = {}
    try:
        for rel in want.files:
            parent = os.path.dirname(rel)
            if parent not in opened:
                # os.walk lists parents first, so the parent's parent is already open
                opened[parent] = _subdir(opened[os.path.dirname(parent)], os.path.basename(parent))
            name = os.path.basename(rel)
            data = _copy_into(opened[parent], name, os.path.join(_AGENT_DIR, rel), 0o644)
            compiled = _bytecode(data, name)
            if compiled is not None:
                if parent not in caches:
                    caches[parent] = os.open(PYCACHE, _DIR_FLAGS, dir_fd=opened[parent])
                _write_new(caches[parent], compiled[0], compiled[1], 0o644)
    finally:
        for fd in [*opened.values(), *caches.values()]:
            os.close(fd)
    if want.helper:
        _copy_into(top_fd, HELPER, want.helper, 0o755)
    fd = os.open(IN_USE, _NEW_FILE, 0o600, dir_fd=top_fd)
    try:
        os.fchmod(fd, 0o644)  # read-only for the agents that flock it
    finally:
        os.close(fd)


def _replaced(agent_dir: AgentDir, name: str) -> PermissionDenied:
    return PermissionDenied(
        f"{os.path.join(agent_dir.path, name)} was replaced while the agent was staged "
        "(someone else writes in that directory); nothing was staged",
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


def _stage_new(agent_dir: AgentDir, want: Manifest) -> None:
    tmp = f".staging-{os.urandom(8).hex()}"  # what secrets.token_hex does, without its imports
    os.mkdir(tmp, 0o700, dir_fd=agent_dir.fd)
    try:
        top_fd = _open_new_dir(agent_dir, tmp)
        try:
            _build(top_fd, want)
            os.fchmod(top_fd, 0o755)  # last: until now no one else could enter it
            try:
                os.rename(tmp, want.name, src_dir_fd=agent_dir.fd, dst_dir_fd=agent_dir.fd)
            except OSError as exc:  # another CLI staged the same content meanwhile?
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or \
                        not verified(agent_dir, want.name, want):
                    raise
                return
            mine = os.fstat(top_fd)
            try:
                now = os.stat(want.name, dir_fd=agent_dir.fd, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                # what we renamed into place was not our copy (ours was moved away meanwhile)
                agent_dir.remove_tree(want.name)
                raise _replaced(agent_dir, tmp)
        finally:
            os.close(top_fd)
    finally:
        agent_dir.remove_tree(tmp)


def remove_tree(agent_dir: AgentDir, name: str) -> None:
    """Remove ``name`` inside without following any link in it (bounded, no recursion)."""
    agent_dir.remove_tree(name)


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
                fd = os.open(IN_USE, _READ_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # staged by a version without the marker: cannot tell, keep it
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # an agent runs from it
                agent_dir.remove_tree(entry)
                removed.append(entry)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
    return removed
