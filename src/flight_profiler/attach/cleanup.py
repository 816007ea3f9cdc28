"""Remove what dead processes left in the private directory, before each injection.

Files are named ``agent-<pidns>-<pid>.sock|.log`` and ``.attach-<pidns>-<pid>.lock`` (older
versions: ``<pid>`` alone). A process of our own pid namespace is dead when /proc has no such
pid; for another namespace /proc cannot tell, so its socket is probed: a refused connection means
no agent listens, and the socket, log and lock go (names of older versions, without the
namespace, go when both /proc and the socket say so). Staged agent copies that no running agent
holds are removed by staging itself. Everything goes through the directory's descriptor, and
whatever sits under those names (a directory, a 1,500-deep tree) goes without a traceback: a
removal that fails leaves the entry for a later sweep.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import stat
import time

from flight_profiler.agent import protocol
from flight_profiler.attach import staging
from flight_profiler.attach.agent_dir import AgentDir

# a held-stderr file is left only by a target that died while it held (last_words.py)
_NAME = re.compile(r"^(?:agent-(?P<a>(?:\d+-)?\d+)\.(?:sock|log(?:\.1)?|held-stderr-\d+-\d+)"
                   r"|\.attach-(?P<b>(?:\d+-)?\d+)\.lock)$")
_ABANDONED_AFTER = staging.SETTLE_SECONDS  # a .staging-* directory this old lost its CLI


def _key_of(name: str) -> str | None:
    m = _NAME.match(name)
    return (m.group("a") or m.group("b")) if m else None


def _dead(key: str, directory: AgentDir, own_ns: int) -> bool:
    ns_text, _, pid_text = key.rpartition("-")
    gone_here = not os.path.exists(f"/proc/{int(pid_text)}")
    if ns_text and int(ns_text) == own_ns:
        return gone_here
    if not ns_text:
        # an older version's name, without the namespace: the pid may be another namespace's,
        # so also ask its socket (a live agent there still accepts)
        return gone_here and _probe(directory, f"agent-{key}.sock") in ("absent", "refused")
    return _probe(directory, f"agent-{key}.sock") == "refused"


def _probe(directory: AgentDir, name: str) -> str:
    """"absent", "refused" (no agent listens), "accepting", or "other" (not a socket)."""
    try:
        st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISSOCK(st.st_mode):
        return "other"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(directory.via_fd(name))
    except OSError as exc:
        return "refused" if exc.errno == errno.ECONNREFUSED else "other"
    finally:
        probe.close()
    return "accepting"


def _remove_lock(directory: AgentDir, name: str) -> None:
    """A lock file goes only if no one holds it (a CLI mid-attach keeps it)."""
    try:
        fd = directory.open_file(name, os.O_RDONLY)
    except Exception:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        directory.unlink(name)
    finally:
        os.close(fd)


def sweep(directory: AgentDir, live_sock: str | None = None) -> list[str]:
    """Remove the leftovers of dead processes; their names. ``live_sock``: the socket name of
    the process about to be attached (no agent answered there): anything under it that is not
    a socket (a directory, a file) would stop its agent from binding, and goes too."""
    own_ns = protocol.pid_namespace()
    removed: list[str] = []
    verdicts: dict[str, bool] = {}
    now = time.time()
    for name in sorted(os.listdir(directory.fd)):
        key = _key_of(name)
        try:
            if key is not None:
                if name == live_sock:
                    st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
                    if not stat.S_ISSOCK(st.st_mode):
                        directory.unlink(name)
                        removed.append(name)
                    continue
                if key not in verdicts:
                    verdicts[key] = _dead(key, directory, own_ns)
                if not verdicts[key]:
                    continue
                if name.endswith(".lock"):
                    _remove_lock(directory, name)
                else:
                    directory.unlink(name)
                removed.append(name)
            elif name.startswith(".staging-"):
                st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
                if now - st.st_mtime > _ABANDONED_AFTER and directory.remove_tree(name):
                    removed.append(name)
        except OSError:
            continue  # left for a later sweep
    return removed
