"""What an injector did and saw in the target: enough to explain a later timeout precisely."""

from __future__ import annotations

from flight_profiler.records import Record


class Outcome(Record):
    """What one injector saw (records.py says why it is not a dataclass)."""

    FIELDS = ("method", "syscall", "holds_gil", "helper_error", "elapsed", "values", "output")

    def __init__(self, method: str, syscall: int | None = None, holds_gil: bool | None = None,
                 helper_error: str | None = None, elapsed: float = 0.0,
                 values: dict[str, str] | None = None, output: str = "") -> None:
        self.method = method
        self.syscall = syscall
        self.holds_gil = holds_gil
        self.helper_error = helper_error
        self.elapsed = elapsed
        self.values = {} if values is None else values
        self.output = output

    # method: "thread" (a new native thread runs the bootstrap) | "pending" | "none"
    # syscall: the main thread's system call number, -1 running user code
    # helper_error: why the thread route could not be used, if it was tried
    # values: the injector's observations, for -v; output: an external tool's own (gdb), for -v

    def main_thread_state(self) -> str:
        if self.syscall is None:
            return "unknown"
        where = f"parked in system call {self.syscall}" if self.syscall >= 0 else "running"
        gil = {True: "holding the GIL", False: "without the GIL", None: "GIL unknown"}
        return f"{where}, {gil[self.holds_gil]}"
