"""Where armed triggers write: one directory per event, complete or absent.

The output directory is opened ONCE, when ``arm`` runs, without following a link
(``O_DIRECTORY | O_NOFOLLOW``), and everything afterwards is made relative to that descriptor:
a directory swapped for a link later (the job's user can write there) changes nothing. An event
is written into a hidden temporary directory (``.fp-arm-tmp-...``), each file created with
``O_EXCL | O_NOFOLLOW`` and fsync'd, ``event.json`` last; the directory is then renamed to its
final name in one step. A reader (``flight_profiler report DIR``) never sees half an event; a
process killed mid-write leaves only a hidden temporary directory, which the next ``arm`` in
that directory removes.

Disk cap: the evidence directories of every agent writing into the directory count, hidden
baselines too. An event that would pass the cap drops its largest files (named in
``event.json`` under "dropped"); once the cap is reached, no new event is written at all and
the trigger counts it as dropped. The OLDEST evidence is kept and the newest dropped: the first
OOM, the first NaN, the first hang are the ones that explain the others. The total stays below
the cap plus one ``event.json`` (at most :data:`MAX_EVENT_JSON` bytes).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import os
import re
import stat
import threading
import time
from typing import IO, Any, Callable

EVENT_FILE = "event.json"
FORMAT = "flight_profiler.arm_event"
VERSION = 1
MAX_EVENT_JSON = 256 * 1024
_TMP_PREFIX = ".fp-arm-tmp-"
BASELINE_PREFIX = ".fp-arm-baseline-"
EVENT_NAME = re.compile(r"^\d{8}-\d{6}-[a-z]+-pid\d+(-rank\d+)?-\d+(\.\d+)?$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SCAN = 20_000  # entries looked at when measuring the directory (a bound, not a limit)
_seq = itertools.count(1)


class EvidenceError(Exception):
    """The output directory cannot be used; the message says why, for the user."""


def plain_json(obj: Any) -> Any:
    """``obj`` with non-finite floats as strings ("nan", "inf"): strict JSON for every reader."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def json_bytes(obj: Any) -> bytes:
    return json.dumps(plain_json(obj), separators=(",", ":")).encode("utf-8")


class EvidenceDir:
    """The output directory of one ``arm``, held by descriptor until disarm."""

    def __init__(self, path: str, cap_bytes: int) -> None:
        self.path = path
        self.cap = cap_bytes
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self.fd = _open_or_make(path)
        try:
            self._probe()
            self._remove_stale_tmp()
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0 and os.getpid() == self.pid:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _probe(self) -> None:
        name = f"{_TMP_PREFIX}probe-{os.getpid()}-{next(_seq)}"
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
            os.rmdir(name, dir_fd=self.fd)
        except OSError as exc:
            raise EvidenceError(f"the job's user (uid {os.geteuid()}) cannot write in {self.path}: "
                                f"{exc.strerror}") from None

    def _remove_stale_tmp(self) -> None:
        """Temporary event directories of processes that died while writing them."""
        with contextlib.suppress(OSError):
            for entry in _entries(self.fd):
                if not entry.name.startswith(_TMP_PREFIX):
                    continue
                pid = entry.name[len(_TMP_PREFIX):].split("-", 1)[0]
                if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                    _remove_flat(self.fd, entry.name)

    # -- accounting ------------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes of evidence in the directory now (every writer's), links never followed."""
        total = 0
        for entry in _entries(self.fd):
            name = entry.name
            try:
                if EVENT_NAME.match(name) and entry.is_dir(follow_symlinks=False):
                    total += _dir_bytes(self.fd, name)
                elif name.startswith(BASELINE_PREFIX) and entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
        return total

    # -- writing ---------------------------------------------------------------------------
    def begin(self, kind: str, rank: int | None) -> Event:
        return Event(self, kind, rank)

    def write_hidden(self, name: str, write: Callable[[IO[bytes]], object]) -> int:
        """A hidden file directly in the directory (a baseline kept for later events)."""
        tmp = f"{_TMP_PREFIX}{os.getpid()}-{next(_seq)}.part"
        size = _write_file(self.fd, tmp, write)
        try:
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        return size

    def unlink_hidden(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self.fd)

    def write_signal(self, name: str, doc: dict[str, Any]) -> None:
        """A small hidden note other agents writing here read (a rank's hang: the others
        capture theirs at once). Replaced whole, never appended to."""
        data = json_bytes(doc)
        self.write_hidden(name, lambda f: f.write(data))

    def read_signal(self, name: str) -> tuple[tuple[int, int], dict[str, Any]] | None:
        """((inode, mtime_ns), content) of a signal, or None (absent, a link, not ours)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
                return None
            doc = json.loads(os.read(fd, 4096).decode("utf-8"))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return ((st.st_ino, st.st_mtime_ns), doc) if isinstance(doc, dict) else None

    def replace_event_json(self, final: str, doc: dict[str, Any]) -> None:
        """Put a completed ``event.json`` in place of the first one (a rename: never half)."""
        data = json_bytes(doc)[:MAX_EVENT_JSON]
        fd = os.open(final, _DIR_FLAGS, dir_fd=self.fd)
        try:
            tmp = f".{EVENT_FILE}.{next(_seq)}.tmp"
            _write_file(fd, tmp, lambda f: f.write(data))
            os.rename(tmp, EVENT_FILE, src_dir_fd=fd, dst_dir_fd=fd)
            os.fsync(fd)
        finally:
            os.close(fd)


class Event:
    """One event's directory while it is being written (hidden until ``commit``)."""

    def __init__(self, root: EvidenceDir, kind: str, rank: int | None) -> None:
        self.root = root
        self.kind = kind
        self.rank = rank
        self.started = time.time()
        self.tmp = f"{_TMP_PREFIX}{os.getpid()}-{next(_seq)}-{kind}"
        os.mkdir(self.tmp, 0o700, dir_fd=root.fd)
        self.fd = os.open(self.tmp, _DIR_FLAGS, dir_fd=root.fd)
        self.files: dict[str, int] = {}
        self.errors: list[str] = []
        self.closed = False

    def write(self, name: str, write: Callable[[IO[bytes]], object]) -> int:
        size = _write_file(self.fd, name, write)
        self.files[name] = size
        return size

    def write_json(self, name: str, obj: Any) -> int:
        data = json_bytes(obj)
        return self.write(name, lambda f: f.write(data))

    def proc_path(self, name: str) -> str:
        """A path into this event's directory through its descriptor, for writers that only
        take a path (torch's exporters): the directory's own name is never resolved again."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def adopt(self, name: str) -> int:
        """Count a file some other writer put here through :meth:`proc_path`."""
        st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            os.unlink(name, dir_fd=self.fd)
            raise OSError(f"{name} is not a regular file")
        self.files[name] = st.st_size
        return st.st_size

    def link_hidden(self, hidden: str, name: str) -> bool:
        """Hard-link a hidden file of the root directory in (no copy; the cap counts it once
        per directory it appears in, which is what ``du`` would say too)."""
        try:
            os.link(hidden, name, src_dir_fd=self.root.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            self.adopt(name)
            return True
        except OSError as exc:
            self.errors.append(f"{name}: {exc.strerror or exc}")
            return False

    def commit(self, doc: dict[str, Any]) -> str | None:
        """Write event.json, apply the cap, rename into place. Returns the final name, or None
        when the cap left no room for even the event (nothing is left behind then)."""
        try:
            with self.root._lock:
                used = self.root.usage()
                dropped = []
                for name, size in sorted(self.files.items(), key=lambda kv: -kv[1]):
                    if used + sum(self.files.values()) + MAX_EVENT_JSON <= self.root.cap:
                        break
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=self.fd)
                    dropped.append({"file": name, "bytes": size})
                    del self.files[name]
                if used + MAX_EVENT_JSON > self.root.cap:
                    self.abort()
                    return None
                full = {"format": FORMAT, "version": VERSION, **doc, "files": dict(self.files),
                        "dropped": dropped, "write_errors": self.errors,
                        "cap_bytes": self.root.cap, "used_bytes_before": used,
                        "write_s": round(time.time() - self.started, 3)}
                data = json_bytes(full)
                if len(data) > MAX_EVENT_JSON:
                    full["truncated"] = True
                    full.pop("detail", None)
                    data = json_bytes(full)[:MAX_EVENT_JSON]
                _write_file(self.fd, EVENT_FILE, lambda f: f.write(data))
                final = self._final_name()
                os.rename(self.tmp, final, src_dir_fd=self.root.fd, dst_dir_fd=self.root.fd)
                os.fsync(self.root.fd)
                self.closed = True
                return final
        except BaseException:
            self.abort()
            raise
        finally:
            self._close_fd()

    def _final_name(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.started))
        rank = f"-rank{self.rank}" if self.rank is not None else ""
        base = f"{stamp}-{self.kind}-pid{os.getpid()}{rank}-{next(_seq)}"
        name, n = base, 0
        while _exists(self.root.fd, name):
            n += 1
            name = f"{base}.{n}"
        return name

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._close_fd()
        with contextlib.suppress(OSError):
            _remove_flat(self.root.fd, self.tmp)

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def _open_or_make(path: str) -> int:
    if not os.path.isabs(path):
        raise EvidenceError(f"output directory {path!r} is not absolute")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise EvidenceError(f"cannot create the output directory {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        linked = exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path)
        why = "it is a symbolic link" if linked else (exc.strerror or str(exc))
        raise EvidenceError(f"cannot use the output directory {path}: {why}") from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise EvidenceError(f"{path} is not a directory")
    return fd


def _write_file(dir_fd: int, name: str, write: Callable[[IO[bytes]], object]) -> int:
    fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise OSError(f"refusing to keep an empty {name}")
        return size
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise


def _entries(dir_fd: int) -> list[os.DirEntry[str]]:
    out = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            out.append(entry)
            if len(out) >= _MAX_SCAN:
                break
    return out


def _dir_bytes(root_fd: int, name: str) -> int:
    fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
    try:
        total = 0
        for entry in _entries(fd):
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
        return total
    finally:
        os.close(fd)


def _remove_flat(root_fd: int, name: str) -> None:
    """Remove a directory of plain files that we made (no recursion, no link followed)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return
    try:
        for entry in _entries(fd):
            with contextlib.suppress(OSError):
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=root_fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False
