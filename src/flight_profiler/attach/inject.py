"""Choose how to get the agent into the target, build the bootstrap text, and inject it.

``choose_method`` is a pure function (unit-tested): remote_exec when PEP 768 can work (target
3.14+, same major.minor as this CLI, not opted out), else our own ptrace injector where it is
supported (x86-64 Linux), else gdb (after a self-test proves it can call and restore safely);
pyrasite only when asked for.
"""

from __future__ import annotations

import os
import sys
import time

from flight_profiler.attach import remote_exec
from flight_profiler.attach.methods import METHODS
from flight_profiler.attach.outcome import Outcome
from flight_profiler.attach.process import TargetInfo
from flight_profiler.errors import AttachFailed, UsageError, gdb_missing, pyrasite_missing
from flight_profiler.records import Record

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Callable

    from flight_profiler.attach import identity

_BOOTSTRAP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "agent", "bootstrap.py")


def choose_method(
    requested: str,
    target_version: tuple[int, int] | None,
    cli_version: tuple[int, int],
    remote_debug_disabled: bool,
    gdb_available: bool,
    pyrasite_available: bool,
    ptrace_supported: bool = True,
) -> str:
    """The injection method to use, or a UsageError/AttachFailed naming why none fits."""
    if requested not in METHODS:
        raise UsageError(f"unknown --method {requested!r}", f"choose one of {', '.join(METHODS)}")
    can_remote = remote_exec.usable(target_version, cli_version, remote_debug_disabled)
    if requested == "remote_exec":
        if can_remote:
            return "remote_exec"
        if target_version is None or target_version < (3, 14):
            why = f"the target runs Python {_v(target_version)}; sys.remote_exec needs 3.14+"
        elif remote_debug_disabled:
            why = "the target disabled remote debugging (PYTHON_DISABLE_REMOTE_DEBUG / -X disable_remote_debug)"
        else:
            why = (f"the target runs Python {_v(target_version)} but this CLI runs "
                   f"{_v(cli_version)}; sys.remote_exec needs the same major.minor")
        raise AttachFailed(f"--method remote_exec cannot be used: {why}", "use --method auto")
    if requested == "pyrasite":
        if not pyrasite_available:
            raise pyrasite_missing()
        return "pyrasite"
    if requested == "ptrace":
        if not ptrace_supported:
            raise AttachFailed("--method ptrace supports x86-64 Linux only",
                               "use --method gdb (or auto)")
        return "ptrace"
    if requested == "auto" and can_remote:
        return "remote_exec"
    if requested == "auto" and ptrace_supported:
        return "ptrace"
    if not gdb_available:
        more = ""
        if target_version is not None and target_version >= (3, 14) and not remote_debug_disabled:
            more = f"or run flight_profiler with Python {_v(target_version)} to use sys.remote_exec"
        raise gdb_missing("attaching to this target", more)
    return "gdb"


def _v(version: tuple[int, int] | None) -> str:
    return f"{version[0]}.{version[1]}" if version else "unknown"


def bootstrap_text(params: dict[str, object]) -> str:
    """The Python text the target runs: the bootstrap source, exec'd off ``__main__``."""
    with open(_BOOTSTRAP, encoding="utf-8") as f:
        source = f.read()
    return (
        "try:\n"
        f"    exec({source!r}, {{'__name__': '_flight_profiler_bootstrap', '_FP': {params!r}}})\n"
        "except BaseException:\n"
        "    pass\n"
    )


class Injection(Record):
    """What one injection did (records.py says why it is not a dataclass)."""

    FIELDS = ("method", "detail", "evidence")

    def __init__(self, method: str, detail: str, evidence: Outcome | None = None) -> None:
        self.method = method
        self.detail = detail  # what happened, for -v and for explaining a timeout
        self.evidence = evidence  # what the ptrace or gdb injector saw


def inject(target: TargetInfo, method: str, deadline: float,
           say: Callable[[str], None] = lambda s: None) -> Injection:
    """Stage the agent and run the chosen injector once. Does not wait for the agent."""
    from flight_profiler.attach import ptrace

    def choose(gdb_available: bool, pyrasite_available: bool) -> str:
        return choose_method(method, target.version, sys.version_info[:2],
                             remote_exec.disabled_in(target.environ, target.cmdline),
                             gdb_available, pyrasite_available, ptrace.supported())

    # Whether gdb or pyrasite is there matters only where the choice falls on them: looked up
    # then (gdb's module imports shutil, bz2, lzma: ~10 ms of a first command, issue 23).
    chosen = choose(True, True)
    gdb_path = None
    if chosen == "gdb":
        from flight_profiler.attach import gdb

        gdb_path = gdb.gdb_path()
        if gdb_path is None:
            chosen = choose(False, True)  # raises: no gdb to fall back on
    elif chosen == "pyrasite":
        from flight_profiler.attach import pyrasite

        if not pyrasite.available():
            chosen = choose(True, False)  # raises: pyrasite is missing
    say(f"injection method: {chosen}")
    helper_path, helper_note = (None, "not needed")
    if chosen == "gdb":
        from flight_profiler.attach import gdb_selftest
        from flight_profiler.attach import helper as helper_mod

        assert gdb_path is not None
        gdb_selftest.check(gdb_path, say)
        helper_path, helper_note = helper_mod.find_helper()
        say(f"helper library: {helper_path or 'none'} ({helper_note})")
    from flight_profiler.attach import identity

    # The process the pre-flight saw, pinned: after a wait for the attach lock its pid may
    # belong to another process, root's perhaps. Nothing is staged or injected for that one.
    with identity.Pin(target) as pin:
        return _inject_pinned(target, chosen, deadline, say, pin, helper_path, helper_note)


def _inject_pinned(target: TargetInfo, chosen: str, deadline: float,
                   say: Callable[[str], None], pin: identity.Pin, helper_path: str | None,
                   helper_note: str) -> Injection:
    from flight_profiler.attach import staging

    staged = staging.stage(target.home, target.ns_pid, target.root, helper_path, target.pid_ns)
    say(f"agent staged at {staged.pkg}")
    if chosen in ("gdb", "pyrasite"):
        _seccomp_before_external_tool(target, say)
    pin.check()  # gdb and pyrasite take the pid number: as late as possible
    base: dict[str, object] = {"pkg": staged.pkg, "log": staged.log, "deadline": deadline,
                               "version": "0.1.0", "sock": staged.sock}
    if chosen == "remote_exec":
        # the script goes beside the staged copy: a directory only we can write, the target reads
        inner = os.path.dirname(os.path.dirname(staged.pkg))
        remote_exec.inject(target.pid, bootstrap_text(base),
                           os.path.join(target.root, inner.lstrip("/")), inner)
        return Injection("remote_exec", "sys.remote_exec queued the bootstrap")
    if chosen == "pyrasite":
        from flight_profiler.attach import pyrasite

        pyrasite.inject(target.pid, bootstrap_text(base), max(deadline - time.time(), 1.0))
        return Injection("pyrasite", "pyrasite ran the bootstrap")
    foreign = bootstrap_text({**base, "foreign": True})
    pending = bootstrap_text({**base, "foreign": False})
    if chosen == "ptrace":
        from flight_profiler.attach import ptrace_inject

        outcome = ptrace_inject.inject(target, foreign, pending, say, pin=pin)
    else:
        from flight_profiler.attach import gdb

        assert target.version is not None
        outcome = gdb.inject(target.pid, target.version, staged.helper, foreign, pending)
        for key, value in outcome.values.items():
            say(f"gdb: {key}={value}")
        for line in outcome.output.splitlines():
            say(f"gdb| {line}")
        if helper_path is None:
            say(helper_note)
    say(f"{chosen} returned in {outcome.elapsed:.3f}s: main thread {outcome.main_thread_state()}, "
        f"agent started by {'a new native thread' if outcome.method == 'thread' else 'a pending call'}")
    return Injection(chosen, outcome.method, outcome)


def _seccomp_before_external_tool(target: TargetInfo, say: Callable[[str], None]) -> None:
    """gdb and pyrasite make the same kinds of calls: the same seccomp verdict first."""
    from flight_profiler.attach.ptrace_inject import sandbox_verdict

    sandbox_verdict(target, say)
