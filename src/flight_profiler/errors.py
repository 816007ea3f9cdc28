"""One error hierarchy for the CLI side.

Every error a user can meet is a :class:`FlightProfilerError`: it carries the exit code the CLI
ends with and the help text that names the fix. The CLI prints ``error: <message>`` and, on the
next line, ``hint: <hint>``; with ``--json`` it prints ``{"error": {...}}`` instead (one printer:
``cli.output.print_error``). Every non-zero exit of a command goes through this hierarchy, even a
verdict the command has already shown itself (``reported=True``: diagnose's --fail-on and
incomplete exits), so that one place (``cli.output.run_cli``) ends the process.

Error texts met in several places are built here once (``already_traced``, ``gdb_missing``...),
so that the same cause always comes with the same fix.

Exit codes are part of the public interface (docs/exit-codes.md); never renumber them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any, ClassVar



class ExitCode:
    OK = 0
    COMMAND_FAILED = 1  # the agent ran the command and it failed, or an unexpected error
    USAGE = 2  # malformed command line or command string (click uses 2 as well)
    PROCESS_NOT_FOUND = 3
    PERMISSION_DENIED = 4
    NOT_PYTHON = 5
    ATTACH_FAILED = 6
    ATTACH_TIMEOUT = 7
    BAD_INPUT_FILE = 8  # report: a file is corrupt, truncated, foreign or unsafe
    FINDINGS = 9  # report/diagnose: a finding reached --fail-on
    AGENT_LOST = 10  # the connection to the agent broke mid-command
    TORCH_MISSING = 11  # the target has not imported torch
    INCOMPLETE = 12  # diagnose: some phases failed or timed out (the report names what is missing)
    AGENT_TIMEOUT = 13  # the agent did not answer within a deadline (or sent a frame too slowly)
    BAD_ANSWER = 14  # the agent's answer was malformed or larger than the CLI accepts
    INTERRUPTED = 130


# What each code means, in a few words for --help (docs/exit-codes.md says it in full).
EXIT_CODE_SUMMARIES: dict[int, str] = {
    ExitCode.OK: "ok",
    ExitCode.COMMAND_FAILED: "command failed",
    ExitCode.USAGE: "usage",
    ExitCode.PROCESS_NOT_FOUND: "no such process",
    ExitCode.PERMISSION_DENIED: "permission",
    ExitCode.NOT_PYTHON: "not Python",
    ExitCode.ATTACH_FAILED: "attach failed",
    ExitCode.ATTACH_TIMEOUT: "attach timed out",
    ExitCode.BAD_INPUT_FILE: "unreadable input file",
    ExitCode.FINDINGS: "findings reached --fail-on",
    ExitCode.AGENT_LOST: "agent lost",
    ExitCode.TORCH_MISSING: "target has no torch",
    ExitCode.INCOMPLETE: "diagnosis incomplete",
    ExitCode.AGENT_TIMEOUT: "agent did not answer in time",
    ExitCode.BAD_ANSWER: "malformed or oversized answer",
    ExitCode.INTERRUPTED: "interrupted",
}


class FlightProfilerError(Exception):
    """Base class: a failure with a message, a hint naming the fix, and an exit code."""

    exit_code: int = ExitCode.COMMAND_FAILED
    kind: ClassVar[str] = "error"
    default_hint: ClassVar[str] = ""

    def __init__(self, message: str, hint: str | None = None, *, reported: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        # True when the command's own output already told the user (its JSON document carries
        # the exit code): the error then only ends the process, printing nothing more.
        self.reported = reported

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
        }


class UsageError(FlightProfilerError):
    exit_code = ExitCode.USAGE
    kind = "usage"
    default_hint = "Run with --help to see the accepted arguments."


class ProcessNotFound(FlightProfilerError):
    exit_code = ExitCode.PROCESS_NOT_FOUND
    kind = "process_not_found"
    default_hint = "Check the pid with `ps aux | grep python`; the process may have exited."


class PermissionDenied(FlightProfilerError):
    exit_code = ExitCode.PERMISSION_DENIED
    kind = "permission_denied"


class NotPython(FlightProfilerError):
    exit_code = ExitCode.NOT_PYTHON
    kind = "not_python"
    default_hint = "Pass the pid of the Python process itself, not a shell or launcher around it."


class AttachFailed(FlightProfilerError):
    exit_code = ExitCode.ATTACH_FAILED
    kind = "attach_failed"


class AttachTimeout(AttachFailed):
    exit_code = ExitCode.ATTACH_TIMEOUT
    kind = "attach_timeout"
    default_hint = "The target was left as it was; retry later or raise --timeout."


class BadInputFile(FlightProfilerError):
    exit_code = ExitCode.BAD_INPUT_FILE
    kind = "bad_input_file"


class FindingsThreshold(FlightProfilerError):
    exit_code = ExitCode.FINDINGS
    kind = "findings"


class Incomplete(FlightProfilerError):
    """diagnose: some phases failed, so a quiet report is no all-clear."""

    exit_code = ExitCode.INCOMPLETE
    kind = "incomplete"


class Interrupted(FlightProfilerError):
    """Ctrl-C: not a failure of the command, so it is said in one bare line and no hint."""

    exit_code = ExitCode.INTERRUPTED
    kind = "interrupted"

    def __init__(self, message: str = "interrupted", *, reported: bool = False) -> None:
        super().__init__(message, "", reported=reported)


class AgentLost(FlightProfilerError):
    exit_code = ExitCode.AGENT_LOST
    kind = "agent_lost"
    default_hint = "The target may have exited; check it with `ps -p <pid>`."


class AgentTimeout(FlightProfilerError):
    """The agent did not answer within a deadline: the command's own time limit plus its
    margin, or a frame that began but did not end in time (docs/commands.md, "Deadlines")."""

    exit_code = ExitCode.AGENT_TIMEOUT
    kind = "agent_timeout"
    default_hint = ("a thread of the target may hold the GIL in a long native call, or what "
                    "answers is not a working agent; retry later, or give it more time with "
                    "--deadline")


class BadAnswer(FlightProfilerError):
    """The agent's answer was malformed (a shape the CLI does not know) or larger than the CLI
    accepts: it is refused before it is shown or used. The connection stays usable unless the
    frame could not be read to its end."""

    exit_code = ExitCode.BAD_ANSWER
    kind = "bad_answer"
    default_hint = ("the agent may be of another flight_profiler version, or not a real agent; "
                    "detach it (`flight_profiler PID --cmd detach`) and attach again")


def malformed(what: str) -> BadAnswer:
    """The one wording of a malformed answer: ``what`` names the field and the problem."""
    return BadAnswer(f"the agent's answer was malformed: {what}")


class TorchMissing(FlightProfilerError):
    exit_code = ExitCode.TORCH_MISSING
    kind = "torch_missing"
    default_hint = "torch commands need a target that has already imported torch."


class RemoteCommandError(FlightProfilerError):
    """The agent ran the command and reported a failure (e.g. no such method)."""

    exit_code = ExitCode.COMMAND_FAILED
    kind = "command_failed"


# The agent reports errors as {"kind", "message", "hint"}; these kinds map to CLI errors.
_REMOTE_KINDS: dict[str, type[FlightProfilerError]] = {
    "usage": UsageError,
    "not_found": RemoteCommandError,
    "torch_missing": TorchMissing,
    "failed": RemoteCommandError,
    "internal": RemoteCommandError,
}


def already_traced(pid: int, tracer: int) -> AttachFailed:
    """Another tracer (a debugger, strace, a second flight_profiler) holds ``pid``."""
    return AttachFailed(f"process {pid} is already traced by PID {tracer} (a debugger?)",
                        f"detach that tracer first (see `ps -p {tracer}`)")


GDB_INSTALL_HINT = "install it: `apt-get install gdb`, or set $FLIGHT_PROFILER_GDB to a gdb binary"


def gdb_missing(needed_for: str, more_hint: str = "") -> AttachFailed:
    """No usable gdb; ``needed_for`` says why one was wanted (e.g. "--method gdb")."""
    return AttachFailed(f"gdb is not installed (needed for {needed_for})",
                        GDB_INSTALL_HINT + (f"; {more_hint}" if more_hint else ""))


def pyrasite_missing() -> AttachFailed:
    return AttachFailed("--method pyrasite needs pyrasite, which is not installed",
                        "`pip install pyrasite`, or use --method auto")


def cannot_write(path: str, exc: OSError) -> FlightProfilerError:
    """A report or diff could not be written where the user asked."""
    from flight_profiler.atomic_files import NotRegularFile

    if isinstance(exc, NotRegularFile):  # a device node, FIFO, directory or symlink there
        return FlightProfilerError(f"cannot write {path}: it is {exc.strerror}",
                                   "pass the path of a regular file (a report replaces it "
                                   "whole), or leave out -o to print the report")
    return FlightProfilerError(f"cannot write {path}: {exc.strerror or exc}",
                               "Check that the directory exists and is writable.")


def cannot_stage(path: str, exc: OSError) -> AttachFailed:
    """The target's /tmp refused the agent's files (full, read-only, or a user namespace that
    cannot represent the owner): said before the target is touched."""
    import errno

    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some space in the target's /tmp (`df -h /tmp`) and retry"
    elif exc.errno == errno.EROFS:
        hint = ("the target's /tmp is read-only: give it a writable /tmp (e.g. a tmpfs: "
                "`docker run --tmpfs /tmp`) for the agent's socket")
    else:
        hint = "run flight_profiler as the target's user, inside its container"
    return AttachFailed(f"cannot write the agent's files in {path}: {why}; the target was not "
                        "touched", hint)


def from_remote(error: dict[str, Any]) -> FlightProfilerError:
    """Turn an error reply from the agent into the matching CLI-side exception."""
    cls = _REMOTE_KINDS.get(str(error.get("kind", "failed")), RemoteCommandError)
    hint = error.get("hint")
    return cls(str(error.get("message", "the agent reported an error")), hint or None)
