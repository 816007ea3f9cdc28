"""Plain data of a diagnosis: what to diagnose, what each phase did, and the outcome."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from flight_profiler.report.models import Report

OK, SKIPPED, FAILED, TIMED_OUT = "ok", "skipped", "failed", "timed_out"


@dataclass(frozen=True)
class MethodTarget:
    """``module [class] method`` as a user types it."""

    module: str
    cls: str | None
    method: str

    @classmethod
    def parse(cls, words: tuple[str, ...] | list[str]) -> MethodTarget:
        from flight_profiler.method_spec import split_method_words

        return cls(*split_method_words(
            words, after=" after the pid",
            hint="e.g. `flight_profiler diagnose 1234 train train_step` or `... mypkg Trainer step`",
        ))

    @property
    def words(self) -> str:
        return " ".join(w for w in (self.module, self.cls, self.method) if w)

    @property
    def label(self) -> str:
        return f"{self.cls}.{self.method}" if self.cls else self.method


@dataclass
class DiagnoseOptions:
    pid: int
    out_dir: str
    target: MethodTarget | None = None
    calls: int = 10  # calls of the method each phase observes
    duration: float = 5.0  # profile window without a method; minimum gap between the censuses
    timeout: float = 30.0  # how long a phase may wait for the method / the agent
    # Called at the start of the profile phase; returns how the window was aligned. Set by
    # ``diagnose --all-ranks`` so that every rank's profile covers the same wall-clock time: the
    # job rules compare ranks' shares of their windows, which mean nothing across different
    # moments of a loaded host.
    align_profile: Callable[[], str] | None = None


@dataclass
class PhaseResult:
    name: str
    title: str
    status: str = OK
    reason: str = ""  # why it was skipped / failed / timed out
    command: str = ""
    seconds: float = 0.0
    started: float = 0.0  # wall clock (time.time()) when the phase began
    files: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status,
                "reason": self.reason, "command": self.command,
                "seconds": round(self.seconds, 3), "started": round(self.started, 3),
                "files": list(self.files), "data": self.data}


@dataclass
class DiagnoseResult:
    options: DiagnoseOptions
    phases: list[PhaseResult] = field(default_factory=list)
    report: Report | None = None
    started: float = field(default_factory=time.time)
    finished: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)  # format -> path of the written report
    attach_seconds: float = 0.0  # connecting (and injecting the agent if none was running)
    # The step the profile found (report/steps.py): what it is, how it was found, steps/s, and
    # where the named method sits in it. None without a profile.
    step: dict[str, Any] | None = None
    # The DataLoader's share of the loop: timed without the profiler (input phase) and in the
    # profile's whole steps, each with what it was measured over. None without a DataLoader.
    dataloader: dict[str, Any] | None = None
    # diagnose --arm: one outcome per trigger asked for (diagnose/arming.py); None without --arm
    armed: list[dict[str, Any]] | None = None

    def phase(self, name: str) -> PhaseResult | None:
        return next((p for p in self.phases if p.name == name), None)

    @property
    def artefacts(self) -> list[str]:
        return [f for p in self.phases for f in p.files]

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        findings = self.report.findings if self.report is not None else []
        return {
            "format": "flight_profiler.diagnose",
            "version": 1,
            "pid": o.pid,
            "target": o.target.words if o.target else None,
            "options": {"calls": o.calls, "duration": o.duration, "timeout": o.timeout,
                        "out_dir": o.out_dir},
            "started": round(self.started, 3),
            "finished": round(self.finished, 3),
            "seconds": round(max(0.0, self.finished - self.started), 3),
            "attach_seconds": round(self.attach_seconds, 3),
            "step": self.step,
            "dataloader": self.dataloader,
            "phases": [p.to_dict() for p in self.phases],
            "artefacts": self.artefacts,
            "outputs": dict(self.outputs),
            "findings": [{"rule": f.rule, "severity": f.severity, "title": f.title}
                         for f in findings],
            "armed": self.armed,
        }
