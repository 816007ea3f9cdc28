"""What a target that died during a request wrote to stderr while the agent held it back.

While torch's profiler starts, runs with ``profile_memory`` or exports, the agent points the
target's fd 2 at a file beside its log (agent/torch_support.py, ``QuietStderr``) and copies back
what is not torch's own noise when it is done. A process that aborts meanwhile never gets that
copy: its last words (the abort's message, faulthandler's traceback) stay in that file, which
the agent could not remove. This finds them for the error that says the agent is gone.

The directory is the target user's: the files are opened by descriptor, never following a link,
and only regular files are read, at most :data:`TAIL_BYTES` of each.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable

from flight_profiler.agent.protocol import HELD_STDERR
from flight_profiler.attach.agent_dir import AgentDir
from flight_profiler.errors import FlightProfilerError
from flight_profiler.safe_text import safe_text

TAIL_BYTES = 4096
Finder = Callable[[], "str | None"]
LINES = 3  # of the tail, in the message; the file holds the rest


def finder(pid: int, home: int, root: str, log_name: str) -> Finder:
    """A callable for when the connection is lost: None while ``pid`` lives, or when it left
    nothing held since now; else one sentence naming the file and its last lines."""
    since = time.time() - 1.0  # mtimes have the file system's granularity
    prefix = (log_name[:-4] if log_name.endswith(".log") else log_name) + HELD_STDERR

    def find() -> str | None:
        if _alive(pid):
            return None
        try:
            with AgentDir.open(home, root) as directory:
                return _describe(directory, prefix, since)
        except (OSError, FlightProfilerError):
            return None

    return find


def _alive(pid: int) -> bool:
    from flight_profiler.attach.process import parse_status

    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            return parse_status(f.read()).state not in ("Z", "X")
    except OSError:
        return False


def _describe(directory: AgentDir, prefix: str, since: float) -> str | None:
    found: list[tuple[float, str]] = []
    for name in os.listdir(directory.fd):
        if not name.startswith(prefix):
            continue
        try:
            st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size > 0 and st.st_mtime >= since:
            found.append((st.st_mtime, name))
    if not found:
        return None
    name = max(found)[1]
    size = directory.size(name)
    text = directory.read_from(name, max(0, size - TAIL_BYTES), TAIL_BYTES).decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()][-LINES:]
    if not lines:
        return None
    return (f"it exited while the agent held back its stderr (torch's profiler running); what it "
            f"wrote last: {safe_text(' | '.join(lines), 600)} (all of it: "
            f"{os.path.join(directory.path, name)})")
