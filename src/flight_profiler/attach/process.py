"""Pre-flight checks on the target, from /proc only (no ptrace): can we attach, and to what?

Each failure raises the matching error from errors.py with one line naming the cause and the fix.
The parsing functions take text so that they are unit-tested without live processes.
"""

from __future__ import annotations

import os
import re

from flight_profiler.errors import (
    AttachFailed,
    NotPython,
    PermissionDenied,
    ProcessNotFound,
    UsageError,
    already_traced,
)
from flight_profiler.records import Record

CAP_SYS_PTRACE = 19

PTRACE_SCOPE_FILE = "/proc/sys/kernel/yama/ptrace_scope"

_LIBPYTHON = re.compile(r"/libpython(\d)\.(\d+)[a-z]*\.so")
_EXE_VERSION = re.compile(r"python(\d)\.(\d+)[a-z]*$")
_EXT_TAG = re.compile(r"\.cpython-(\d)(\d+)[a-z]*-")
_STDLIB_DIR = re.compile(r"/lib/python(\d)\.(\d+)/")


class TargetInfo(Record):
    """What /proc says of the target (records.py says why this is not a dataclass)."""

    FIELDS = ("pid", "uid", "state", "tracer_pid", "ns_pid", "start_time", "exe", "version",
              "libpython", "root", "cmdline", "environ", "pid_ns", "uids")

    def __init__(self, pid: int, uid: int, state: str, tracer_pid: int, ns_pid: int,
                 start_time: int, exe: str, version: tuple[int, int] | None,
                 libpython: str | None, root: str, cmdline: list[str] | None = None,
                 environ: dict[str, str] | None = None, pid_ns: int = 0,
                 uids: tuple[int, ...] = ()) -> None:
        self.pid = pid
        self.uid = uid  # effective uid (what its agent's listening socket carries)
        self.state = state
        self.tracer_pid = tracer_pid
        self.ns_pid = ns_pid  # the pid as the target sees itself (differs inside a container)
        self.start_time = start_time
        self.exe = exe
        self.version = version
        self.libpython = libpython  # None: statically linked interpreter
        # "/proc/PID/root" when the target lives in another mount namespace, else "/"
        self.root = root
        self.cmdline = [] if cmdline is None else cmdline
        self.environ = {} if environ is None else environ
        self.pid_ns = pid_ns  # inode of its pid namespace: with ns_pid, names its files (0: unknown)
        self.uids = uids  # real, effective, saved, file-system

    @property
    def home(self) -> int:
        """Whose private directory holds the agent's socket and log (root's for mixed uids)."""
        from flight_profiler.agent.protocol import home_uid

        return home_uid(self.uids) if self.uids else self.uid

    @property
    def version_str(self) -> str:
        return f"{self.version[0]}.{self.version[1]}" if self.version else "unknown"


class Status(Record):
    FIELDS = ("state", "tracer_pid", "uids", "ns_pid", "cap_eff", "tgid", "cap_prm")

    def __init__(self, state: str, tracer_pid: int, uids: tuple[int, int, int, int], ns_pid: int,
                 cap_eff: int, tgid: int = 0, cap_prm: int = 0) -> None:
        self.state = state
        self.tracer_pid = tracer_pid
        self.uids = uids
        self.ns_pid = ns_pid
        self.cap_eff = cap_eff
        self.tgid = tgid
        self.cap_prm = cap_prm


def parse_status(text: str) -> Status:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    ids = [int(x) for x in fields.get("Uid", "0 0 0 0").split()[:4]] or [0]
    ids += [ids[-1]] * (4 - len(ids))  # real, effective, saved, filesystem
    ns = fields.get("NSpid", "").split()
    return Status(
        state=fields.get("State", "?").split()[0] if fields.get("State") else "?",
        tracer_pid=int(fields.get("TracerPid", "0") or 0),
        uids=(ids[0], ids[1], ids[2], ids[3]),
        ns_pid=int(ns[-1]) if ns else 0,
        cap_eff=int(fields.get("CapEff", "0"), 16),
        tgid=int(fields.get("Tgid", "0") or 0),
        cap_prm=int(fields.get("CapPrm", "0"), 16),
    )


def python_version_from(exe: str, maps: str) -> tuple[tuple[int, int] | None, str | None]:
    """(major, minor) and the libpython path, from the exe path and /proc/PID/maps text.

    A shared libpython names the version; a statically linked interpreter is recognised by its
    exe name, else by the version tag of a loaded extension module or its stdlib directory.
    """
    for line in maps.splitlines():
        m = _LIBPYTHON.search(line)
        if m:
            path = line.split(None, 5)[-1] if len(line.split(None, 5)) == 6 else None
            return (int(m.group(1)), int(m.group(2))), path
    m = _EXE_VERSION.search(os.path.basename(exe.replace(" (deleted)", "")))
    if m:
        return (int(m.group(1)), int(m.group(2))), None
    for pattern in (_EXT_TAG, _STDLIB_DIR):
        m = pattern.search(maps)
        if m:
            return (int(m.group(1)), int(m.group(2))), None
    return None, None


def ptrace_scope() -> int | None:
    try:
        with open(PTRACE_SCOPE_FILE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama: classic ptrace rules


def in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    return any(word in text for word in ("docker", "kubepods", "containerd", "lxc"))


def permission_hint(scope: int | None, container: bool) -> str:
    """The fix for a refused ptrace, most likely first."""
    parts = []
    if container:
        parts.append("in Docker run the container with `--cap-add=SYS_PTRACE` "
                     "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])")
    if scope is not None and scope > 0:
        parts.append(f"kernel.yama.ptrace_scope is {scope}: run as root (sudo) or "
                     "`sudo sysctl kernel.yama.ptrace_scope=0`")
    parts.append("run as the target's user or as root")
    return "; ".join(parts)


def check_ptrace_allowed(status: Status, caller_uid: int, caller_caps: int, pid: int) -> None:
    """Raise PermissionDenied when the kernel will refuse ptrace (predicted without trying)."""
    scope = ptrace_scope()
    has_cap = bool(caller_caps & (1 << CAP_SYS_PTRACE))
    if scope == 3:
        raise PermissionDenied(
            f"ptrace is disabled on this machine (kernel.yama.ptrace_scope=3); cannot attach to {pid}",
            "only Python 3.14 targets can be attached without ptrace (--method remote_exec), "
            "or reboot with a lower ptrace_scope",
        )
    if has_cap:
        return
    lacking = status.cap_prm & ~caller_caps
    if caller_uid == 0 and (lacking or any(uid != 0 for uid in status.uids[:3])):
        # root in a container (or a sandbox) without CAP_SYS_PTRACE: the uid is not the cause
        raise PermissionDenied(
            f"you are root but without the CAP_SYS_PTRACE capability, which attaching to "
            f"process {pid} needs" + (" (it holds capabilities you lack)" if lacking else ""),
            "in Docker run the container with `--cap-add=SYS_PTRACE` (Kubernetes: "
            "securityContext.capabilities.add: [SYS_PTRACE]), or run from the host as root",
        )
    if any(uid != caller_uid for uid in status.uids[:3]):
        raise PermissionDenied(
            f"process {pid} belongs to uid {status.uids[1]}, you are uid {caller_uid}",
            f"run as that user or with sudo: `sudo flight_profiler {pid}`",
        )
    if lacking:
        raise PermissionDenied(
            f"process {pid} holds capabilities you lack (CapPrm {status.cap_prm:#x}); only a "
            "caller with CAP_SYS_PTRACE may attach to it",
            f"run with sudo: `sudo flight_profiler {pid}`",
        )
    if scope == 2:
        raise PermissionDenied(
            "kernel.yama.ptrace_scope=2 allows only root to attach",
            "run with sudo, or `sudo sysctl kernel.yama.ptrace_scope=0`",
        )
    if scope == 1:
        raise PermissionDenied(
            f"kernel.yama.ptrace_scope=1 forbids attaching to {pid} (not your child process)",
            "run with sudo, or `sudo sysctl kernel.yama.ptrace_scope=0`"
            + ("; in Docker add `--cap-add=SYS_PTRACE`" if in_container() else ""),
        )


def check_permissions(pid: int) -> None:
    """Predict a ptrace refusal before running gdb (which would only say "not permitted")."""
    try:
        status = parse_status(_read(f"/proc/{pid}/status"))
    except FileNotFoundError:
        raise ProcessNotFound(f"no process with pid {pid}") from None
    check_ptrace_allowed(status, os.geteuid(), _caller_caps(), pid)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _caller_caps() -> int:
    try:
        return parse_status(_read("/proc/self/status")).cap_eff
    except OSError:
        return 0


def target_root(pid: int) -> str:
    """Path prefix under which the CLI sees the target's filesystem.

    "/" when the target shares our mount namespace; else /proc/PID/root (a container, or just a
    private /tmp), through which its files and its agent's socket are reachable.
    """
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            return "/"
    except OSError:
        return "/"
    return f"/proc/{pid}/root"


def check_mixed_uids(pid: int, status: Status) -> None:
    """A process whose uids differ is served to root alone, from root's private directory; its
    agent reaches that directory with a file-system uid of 0, which the kernel grants only if
    one of its uids is 0. Without one (a set-user-ID program of another user) it cannot."""
    uids = status.uids
    if len(set(uids)) > 1 and 0 not in uids:
        raise PermissionDenied(
            f"process {pid} runs with mixed uids (real {uids[0]}, effective {uids[1]}, saved "
            f"{uids[2]}) and none of them is root: flight_profiler serves such a process to "
            "root only, from root's directory, which it cannot reach",
            "not supported: profile it from a process that runs as one user")


def check_user_namespace(pid: int, status: Status) -> None:
    """Refuse a target in another user namespace unless the uids that matter map to
    themselves there: its agent sees uids through that namespace's map (root outside shows
    as the overflow uid), so it could not tell you from another user (rootless containers,
    ``unshare -U``)."""
    try:
        theirs, ours = os.readlink(f"/proc/{pid}/ns/user"), os.readlink("/proc/self/ns/user")
        if theirs == ours:
            return
        text = _read(f"/proc/{pid}/uid_map")
    except FileNotFoundError:
        raise ProcessNotFound(f"process {pid} exited") from None
    except OSError:
        return  # no namespaces to compare: nothing to refuse
    me = os.geteuid()
    for uid in {me, *status.uids}:
        if not identity_mapped(text, uid):
            raise PermissionDenied(
                f"process {pid} runs in a user namespace of its own (a rootless container or "
                f"`unshare -U`) where uid {uid} is not uid {uid}: its agent could not tell you "
                "from another user",
                "run flight_profiler inside that container, as the job's user "
                "(e.g. `podman exec CONTAINER flight_profiler ...`)")


def identity_mapped(uid_map: str, uid: int) -> bool:
    """Whether /proc/PID/uid_map text maps ``uid`` (as we see it) to the same uid inside."""
    for line in uid_map.splitlines():
        parts = line.split()
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            continue
        inside, outside, count = (int(p) for p in parts)
        if outside <= uid < outside + count:
            return inside == outside
    return False


def stopped(pid: int, state: str) -> AttachFailed:
    return AttachFailed(f"process {pid} is stopped (state {state})",
                        f"resume it with `kill -CONT {pid}` and retry")


def check_injectable(pid: int) -> None:
    """Refuse an injection into a process another tracer holds or that is stopped, read afresh
    (under the attach lock, so a concurrent flight_profiler attach has finished by then)."""
    try:
        status = parse_status(_read(f"/proc/{pid}/status"))
    except FileNotFoundError:
        raise ProcessNotFound(f"process {pid} exited") from None
    if status.tracer_pid:
        raise already_traced(pid, status.tracer_pid)
    if status.state in ("T", "t"):
        raise stopped(pid, status.state)


def inspect(pid: int, check_permissions: bool = True) -> TargetInfo:
    """Everything the attach needs to know about ``pid``; raises with the fix if it cannot."""
    if pid <= 0:
        raise ProcessNotFound(f"invalid pid {pid}")
    try:
        status = parse_status(_read(f"/proc/{pid}/status"))
    except FileNotFoundError:
        raise ProcessNotFound(f"no process with pid {pid}") from None
    except PermissionError:
        raise PermissionDenied(f"cannot read /proc/{pid}/status",
                               permission_hint(ptrace_scope(), in_container())) from None
    if status.state in ("Z", "X"):
        raise ProcessNotFound(f"process {pid} has exited (zombie)")
    check_user_namespace(pid, status)
    check_mixed_uids(pid, status)
    if status.tgid and status.tgid != pid:
        raise UsageError(f"{pid} is a thread of process {status.tgid}, not a process",
                         f"use the process id: `flight_profiler {status.tgid}`")
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        maps = _read(f"/proc/{pid}/maps")
    except FileNotFoundError:
        raise ProcessNotFound(f"process {pid} exited") from None
    except PermissionError:
        if os.geteuid() == 0 or os.geteuid() == status.uids[1]:
            # Not a uid mismatch: the kernel's ptrace check failed (a process of another user
            # namespace, e.g. a container's init, or a capability this caller was denied).
            raise PermissionDenied(
                f"the kernel does not let you read process {pid}'s memory map, though you are "
                f"uid {os.geteuid()}: it belongs to another user namespace or needs "
                "CAP_SYS_PTRACE, which this caller lacks",
                permission_hint(ptrace_scope(), in_container())) from None
        raise PermissionDenied(
            f"process {pid} belongs to uid {status.uids[1]}; you (uid {os.geteuid()}) may not "
            "inspect it", f"run as that user or with sudo: `sudo flight_profiler {pid}`"
        ) from None
    version, libpython = python_version_from(exe, maps)
    if version is None:
        raise NotPython(f"process {pid} ({os.path.basename(exe)}) is not a CPython interpreter")
    if version < (3, 9):
        raise NotPython(f"process {pid} runs Python {version[0]}.{version[1]}; "
                        "flight_profiler supports CPython 3.9 and later")
    # A tracer (strace, a debugger, another flight_profiler injecting right now, whose ptrace
    # stop shows as state "t") is judged only on the way to an injection, under the attach lock
    # (``check_injectable``): an agent already running answers whoever traces the process, and
    # a concurrent attach is waited for, not mistaken for a debugger.
    if status.state == "T" and not status.tracer_pid:
        raise stopped(pid, status.state)
    if check_permissions:
        check_ptrace_allowed(status, os.geteuid(), _caller_caps(), pid)
    try:
        cmdline = _read(f"/proc/{pid}/cmdline").split("\0")
    except OSError:
        cmdline = []
    environ: dict[str, str] = {}
    try:
        for item in _read_bytes(f"/proc/{pid}/environ").split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep:
                environ[key.decode(errors="replace")] = value.decode(errors="replace")
    except OSError:
        pass
    from flight_profiler.agent.protocol import pid_namespace, process_start_time

    try:
        start_time = process_start_time(pid)
    except (OSError, ValueError):
        raise ProcessNotFound(f"process {pid} exited") from None
    return TargetInfo(
        pid=pid, uid=status.uids[1], state=status.state, tracer_pid=status.tracer_pid,
        ns_pid=status.ns_pid or pid, start_time=start_time, exe=exe, version=version,
        libpython=libpython, root=target_root(pid), cmdline=[c for c in cmdline if c],
        environ=environ, pid_ns=pid_namespace(pid), uids=status.uids,
    )
