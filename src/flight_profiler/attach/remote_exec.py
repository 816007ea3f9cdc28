"""PEP 768 ``sys.remote_exec`` (CPython 3.14+): no ptrace stop, no gdb.

The interpreter writes the script path into the target's thread state and raises an eval-breaker
bit; the target runs the script at its next check (an idle main thread runs it when it wakes).
Caller and target must be the same major.minor. NOT exercised on this project's machines (no 3.14
there): only the choice logic is unit-tested.
"""

from __future__ import annotations

import os
import sys

from flight_profiler.errors import AttachFailed, PermissionDenied


def disabled_in(environ: dict[str, str], cmdline: list[str]) -> bool:
    """True when the target opted out of remote debugging (env var or ``-X`` option)."""
    if environ.get("PYTHON_DISABLE_REMOTE_DEBUG"):
        return True
    args = cmdline[1:]  # cmdline[0] is the interpreter
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-X", "-W"):  # options taking a separate value
            value = args[i + 1] if i + 1 < len(args) else ""
            if arg == "-X" and value.split("=")[0] == "disable_remote_debug":
                return True
            i += 2
            continue
        if arg.startswith("-X") and arg[2:].split("=")[0] == "disable_remote_debug":
            return True
        if not arg.startswith("-") or arg in ("-c", "-m", "-", "--"):
            break  # the program starts here: what follows are its own arguments
        i += 1
    return False


def usable(target_version: tuple[int, int] | None, cli_version: tuple[int, int],
           disabled: bool) -> bool:
    return (target_version is not None and target_version >= (3, 14)
            and target_version == cli_version and not disabled)


def inject(pid: int, text: str, script_dir: str, inner_dir: str) -> None:
    """Write ``text`` to a script in the target's private dir and ask the target to run it."""
    remote_exec = getattr(sys, "remote_exec", None)
    if remote_exec is None:
        raise AttachFailed("this Python has no sys.remote_exec (needs 3.14+)",
                           "use --method gdb")
    import tempfile  # here: only this injection pays for it (issue 23)

    fd, outer = tempfile.mkstemp(prefix="bootstrap-", suffix=".py", dir=script_dir)
    # fchmod, not chmod: the directory is the target user's, who could swap the name for a link
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    inner = os.path.join(inner_dir, os.path.basename(outer))
    try:
        remote_exec(pid, inner)
    except PermissionError as exc:
        raise PermissionDenied(f"sys.remote_exec refused: {exc}",
                               "run as the target's user or root") from None
    except (OSError, RuntimeError) as exc:
        raise AttachFailed(f"sys.remote_exec failed: {exc}", "try --method gdb") from None
