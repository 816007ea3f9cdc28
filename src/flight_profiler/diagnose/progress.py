"""Live progress of a diagnosis on stderr: a rich status line on a terminal, plain lines otherwise.

The workflow calls ``phase`` when a phase starts, ``waiting`` with what it waits for (updated as
calls arrive), and ``done`` with the phase's result. Nothing here goes to stdout, so ``--json``
output stays one clean document.
"""

from __future__ import annotations

import sys
import time
from typing import IO, TYPE_CHECKING, Any, Protocol

from flight_profiler.safe_text import safe_text

if TYPE_CHECKING:
    from flight_profiler.diagnose.model import PhaseResult


class Progress(Protocol):
    def phase(self, index: int, total: int, title: str) -> None: ...
    def waiting(self, text: str) -> None: ...
    def done(self, result: PhaseResult) -> None: ...
    def close(self) -> None: ...


def _outcome(result: PhaseResult) -> str:
    if result.status == "ok":
        files = f", {len(result.files)} file(s)" if result.files else ""
        return f"done in {result.seconds:.1f}s{files}"
    return f"{result.status.replace('_', ' ')}: {result.reason}"


class NullProgress:
    def phase(self, index: int, total: int, title: str) -> None:
        pass

    def waiting(self, text: str) -> None:
        pass

    def done(self, result: PhaseResult) -> None:
        pass

    def close(self) -> None:
        pass


class PlainProgress:
    """One line per phase start and end; waiting lines at most every 2 s (logs stay short)."""

    def __init__(self, stream: IO[str] | None = None, min_interval: float = 2.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval = min_interval
        self._last = 0.0
        self._last_text = ""
        self._prefix = ""

    def _write(self, text: str) -> None:
        self.stream.write(safe_text(text) + "\n")  # reasons quote the agent's errors
        self.stream.flush()

    def phase(self, index: int, total: int, title: str) -> None:
        self._prefix = f"[{index}/{total}] {title}"
        self._write(f"{self._prefix} ...")
        self._last = time.monotonic()

    def waiting(self, text: str) -> None:
        now = time.monotonic()
        if text != self._last_text and now - self._last >= self.min_interval:
            self._write(f"{self._prefix}: {text}")
            self._last = now
        self._last_text = text

    def done(self, result: PhaseResult) -> None:
        self._write(f"{self._prefix}: {_outcome(result)}")

    def close(self) -> None:
        pass


class RichProgress:
    """A spinner with the phase, what it waits for and the elapsed time (stderr terminal only)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.status import Status

        self.console = console or Console(stderr=True)
        self._title = ""
        self._text = ""
        self._started = time.monotonic()
        # The line is rebuilt at every refresh (rich calls __rich__), so the elapsed time ticks
        # even while nothing arrives.
        self._status: Status = self.console.status(self, spinner="dots")
        self._status.start()

    def __rich__(self) -> Any:
        from rich.text import Text

        line = Text(self._title, style="bold")
        if self._text:
            line.append(f": {safe_text(self._text)}")
        line.append(f" ({time.monotonic() - self._started:.0f}s)", style="dim")
        return line

    def _refresh(self) -> None:
        self._status.update(self)

    def phase(self, index: int, total: int, title: str) -> None:
        self._title = f"[{index}/{total}] {title}"
        self._text = ""
        self._started = time.monotonic()
        self._refresh()

    def waiting(self, text: str) -> None:
        self._text = text
        self._refresh()

    def done(self, result: PhaseResult) -> None:
        from flight_profiler.safe_text import safe_markup as escape  # reasons quote the agent

        style = {"ok": "green", "skipped": "yellow"}.get(result.status, "red")
        self.console.print(f"[{style}]{'✓' if result.status == 'ok' else '-'}[/{style}] "
                           f"{escape(self._title)}: {escape(_outcome(result))}", highlight=False)

    def close(self) -> None:
        self._status.stop()


def make_progress(enabled: bool = True) -> Progress:
    if not enabled:
        return NullProgress()
    if sys.stderr.isatty():
        return RichProgress()
    return PlainProgress()
