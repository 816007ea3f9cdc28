"""What an injector did and saw in the target: enough to explain a later timeout precisely."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    method: str  # "thread" (a new native thread runs the bootstrap) | "pending" | "none"
    syscall: int | None = None  # main thread's system call number, -1 running user code
    holds_gil: bool | None = None
    helper_error: str | None = None  # why the thread route could not be used, if it was tried
    elapsed: float = 0.0
    values: dict[str, str] = field(default_factory=dict)  # injector's observations, for -v
    output: str = ""  # an external tool's own output (gdb), for -v

    def main_thread_state(self) -> str:
        if self.syscall is None:
            return "unknown"
        where = f"parked in system call {self.syscall}" if self.syscall >= 0 else "running"
        gil = {True: "holding the GIL", False: "without the GIL", None: "GIL unknown"}
        return f"{where}, {gil[self.holds_gil]}"
