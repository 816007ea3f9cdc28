"""The process the pre-flight looked at, pinned, so that nothing is injected into another one.

Between the pre-flight and the injection an attach can wait a while (for the attach lock that
another user may hold on purpose). Meanwhile the process can exit and its pid go to another
process, root's perhaps: ptrace takes a pid number, so an injection would then run our code in
that process. So the process is pinned before the injector starts: a pidfd (which never names a
later process) and a descriptor of its ``/proc/PID`` directory (whose files fail once that
process is gone, whatever takes the pid next). ``check`` re-reads through them that it is the
same process the pre-flight saw (start time, executable, effective uid) and still alive; the
injector runs it after PTRACE_SEIZE (which took the pid number) and before every write.
"""

from __future__ import annotations

import errno
import os
import select

from flight_profiler.attach.process import TargetInfo
from flight_profiler.errors import ProcessNotFound
from flight_profiler.records import FrozenRecord


def _replaced(pid: int, why: str) -> ProcessNotFound:
    return ProcessNotFound(
        f"process {pid} is not the one flight_profiler inspected any more ({why}); nothing "
        "was injected", "the process exited or changed; check the pid (`ps -p PID -o "
        "pid,lstart,user,cmd`) and retry")


class Seen(FrozenRecord):
    """What identifies the process: the pre-flight's view of it (frozen; records.py says why it is not a dataclass)."""

    FIELDS = ("start_time", "exe", "uid")
    start_time: int
    exe: str
    uid: int

    def __init__(self, start_time: int, exe: str, uid: int) -> None:
        self._set("start_time", start_time)
        self._set("exe", exe)
        self._set("uid", uid)


def parse(stat: str, status: str, exe: str) -> Seen:
    """The identity from the text of ``/proc/PID/stat``, ``status`` and the ``exe`` link."""
    start_time = int(stat.rsplit(")", 1)[1].split()[19])
    uid = -1
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[2])  # effective
    return Seen(start_time, exe.removesuffix(" (deleted)"), uid)


def differs(expected: Seen, now: Seen) -> str | None:
    """Why ``now`` is not the process ``expected`` describes, or None."""
    if now.start_time != expected.start_time:
        return (f"it started at tick {now.start_time}, the inspected one at tick "
                f"{expected.start_time}: the pid was reused")
    if now.exe != expected.exe:
        return f"it now runs {now.exe}, not {expected.exe}"
    if now.uid != expected.uid:
        return f"it now runs as uid {now.uid}, not uid {expected.uid}"
    return None


class Pin:
    """A pidfd and a ``/proc/PID`` descriptor of one process; ``check`` raises ProcessNotFound
    once they no longer lead to the process the pre-flight saw. Close it when done."""

    def __init__(self, target: TargetInfo) -> None:
        self.pid = target.pid
        self.expected = Seen(target.start_time, target.exe.removesuffix(" (deleted)"),
                             target.uid)
        self.pidfd = -1
        self.procfd = -1
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError) as exc:  # Linux < 5.3: the /proc descriptor only
            if isinstance(exc, OSError) and exc.errno == errno.ESRCH:
                raise _replaced(self.pid, "it exited") from None
        try:
            self.procfd = os.open(f"/proc/{self.pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.close()
            raise _replaced(self.pid, "it exited") from None
        try:
            self.check()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self.pidfd, self.procfd):
            if fd >= 0:
                os.close(fd)
        self.pidfd = self.procfd = -1

    def _read(self, name: str) -> str:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.procfd)
        try:
            return os.read(fd, 1 << 16).decode(errors="replace")
        finally:
            os.close(fd)

    def check(self) -> None:
        if self.pidfd >= 0 and select.select([self.pidfd], [], [], 0)[0]:
            raise _replaced(self.pid, "it exited")
        try:
            now = parse(self._read("stat"), self._read("status"),
                        os.readlink("exe", dir_fd=self.procfd))
        except (OSError, IndexError, ValueError):
            # ESRCH/ENOENT: the /proc directory we hold belongs to a process that is gone
            raise _replaced(self.pid, "it exited") from None
        why = differs(self.expected, now)
        if why:
            raise _replaced(self.pid, why)
