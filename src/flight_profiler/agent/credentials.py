"""Who may talk to this process's agent, and how the agent reaches the directory its files live
in, decided from the process's own real, effective, saved and file-system uids.

The rule is the kernel's (``protocol.serves``): root always; another user only when every uid of
the process is theirs and the process is dumpable. A process with mixed uids (a root job that
called ``seteuid(1000)`` for a while: real and saved uid stay 0, so it can take root back at
any moment) is served to root alone, and its socket and log live in root's private directory
(``protocol.home_uid``), where the user it currently acts as cannot reach them.

Its effective uid cannot enter that directory either. The few system calls on it (creating the
directory, binding and renaming the socket, opening and rotating the log, unlinking at exit)
run in a short-lived thread of the agent's own whose file-system uid is set to root's with
``setfsuid``, which acts on the calling thread only (the C library does not broadcast it, as it
does ``seteuid``) and which the kernel allows because the real or saved uid is 0. A thread's
credentials die with it: no thread of the target ever runs with other credentials than its
own, and the agent's request threads keep the target's.
"""

from __future__ import annotations

import _thread
import gc
import os

from . import protocol

TYPE_CHECKING = False  # not typing's: a target without it pays ~5 ms for it (issue 23)
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    T = TypeVar("T")


_NO_CHANGE = 0xFFFFFFFF  # setfsuid(-1) changes nothing and returns the current fsuid
_libc: Any = None
_home_threads: set[int] = set()  # the helper threads now acting with another fsuid


def own_uids() -> tuple[int, int, int, int]:
    try:
        return protocol.process_uids()
    except (OSError, ValueError):  # no /proc: the thread's own view (fsuid follows euid)
        real, effective, saved = os.getresuid()
        return (real, effective, saved, effective)


def home_uid() -> int:
    """Whose private directory holds this process's socket and log."""
    return protocol.home_uid(own_uids())


def may_connect(peer_uid: int) -> bool:
    """Whether a client of ``peer_uid`` may talk to this agent, judged from the process's
    credentials now (a job may change them while the agent runs)."""
    try:
        uids = own_uids()
        owner = os.stat("/proc/self").st_uid
    except (OSError, ValueError):
        return peer_uid == 0
    return protocol.serves(peer_uid, uids, owner)


def _setfsuid() -> Any:
    global _libc
    if _libc is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.setfsuid.argtypes = [ctypes.c_uint32]
        libc.setfsuid.restype = ctypes.c_int
        _libc = libc
    return _libc.setfsuid


def as_home(uid: int, fn: Callable[[], T]) -> T:
    """``fn()`` with the file-system identity of ``uid`` (the agent's home directory's owner).

    The usual case, a process acting as that uid already, calls ``fn`` directly. Otherwise
    ``fn`` runs in a new native thread (``_thread``: no trace or profile hook of the target's
    is installed in it) that first switches its own fsuid; automatic garbage collection is
    held off meanwhile, so that no finalizer of the target's runs in that thread.
    """
    if _thread.get_ident() in _home_threads:  # a helper calling again (rotation reopens the log)
        if _setfsuid()(_NO_CHANGE) == uid:
            return fn()
    elif os.geteuid() == uid:
        return fn()
    setfsuid = _setfsuid()
    done = _thread.allocate_lock()
    done.acquire()
    box: list[Any] = []

    def run() -> None:
        _home_threads.add(_thread.get_ident())
        try:
            setfsuid(uid)
            if setfsuid(_NO_CHANGE) != uid:
                raise PermissionError(f"this process may not act as uid {uid} (its uids are "
                                      f"{own_uids()}): no agent directory it can use")
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller, never to threading's excepthook
            box.append((False, exc))
        finally:
            _home_threads.discard(_thread.get_ident())
            done.release()

    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            _thread.start_new_thread(run, ())
        except RuntimeError as exc:  # no thread (interpreter shutdown, no memory): not at all
            raise PermissionError(f"cannot act as uid {uid}: {exc}") from None
        done.acquire()
    finally:
        if collecting:
            gc.enable()
    ok, value = box[0]
    if not ok:
        raise value
    result: T = value
    return result
