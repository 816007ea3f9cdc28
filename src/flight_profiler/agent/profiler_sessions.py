"""One torch.profiler session per recorded call (see call_window for why), in the call's thread.

``PerCall(torch, kwargs, roles)``: ``start(i)``/``stop(i)`` for call_window.record_calls.
``roles[i]`` says what call i is for: "active" (profiled and kept), "warmup" (profiled and
dropped: the first sessions pay kineto's start-up), "wait" (not profiled). Active calls are
wrapped in a ``ProfilerStep#i`` record_function when ``steps`` is set, as torch.profiler's own
schedule does, and in a ``mark`` annotation when one is given (step_marks.CALL_MARK: the report
then knows these steps are calls of a method). ``stop()`` only ends collection (PyTorch parses results lazily); exporting
happens later in the agent's thread. ``finish()`` returns the kept sessions and makes any late
one (a call still in flight after a cancel) be discarded when it ends.
"""

from __future__ import annotations

from typing import Any

from .call_window import Sessions
from .torch_support import QuietStderr, quiet_native_stderr


class PerCall:
    def __init__(self, torch: Any, kwargs: dict[str, Any], roles: list[str] | None = None,
                 steps: bool = False, sync_cuda: bool = False, mark: str | None = None) -> None:
        self.torch = torch
        self.mark = mark
        self.kwargs = kwargs
        self.roles = roles
        self.steps = steps
        self.sync_cuda = sync_cuda
        # profile_memory makes c10 log a "Memory block of unknown size" line when a block from
        # before the session is freed during it: stderr stays filtered for each such call.
        self.quiet_calls = bool(kwargs.get("profile_memory"))
        self.sessions = Sessions()
        self._live: dict[int, tuple[Any, list[Any], Any]] = {}  # index -> (prof, spans, quiet)

    def role(self, index: int) -> str:
        return self.roles[index] if self.roles is not None and index < len(self.roles) else "active"

    def start(self, index: int) -> None:
        role = self.role(index)
        if role == "wait":
            return
        quiet = QuietStderr(python_warnings=False) if self.quiet_calls else None
        try:
            prof = self.torch.profiler.profile(**self.kwargs)
            with quiet_native_stderr():
                prof.start()
        except BaseException:
            if quiet is not None:
                quiet.close()
            raise
        spans = []
        if role == "active":
            names = ([f"ProfilerStep#{index}"] if self.steps else []) + ([self.mark] if self.mark else [])
            for name in names:
                span = self.torch.autograd.profiler.record_function(name)
                span.__enter__()
                spans.append(span)
        self._live[index] = (prof, spans, quiet)

    def stop(self, index: int) -> None:
        entry = self._live.pop(index, None)
        if entry is None:
            return
        prof, spans, quiet = entry
        try:
            for span in reversed(spans):
                span.__exit__(None, None, None)
            if self.sync_cuda:
                self.torch.cuda.synchronize()
            with quiet_native_stderr():
                prof.stop()
        finally:
            if quiet is not None:
                quiet.close()
        if self.role(index) == "active":
            self.sessions.keep(index, prof)

    def finish(self) -> list[Any]:
        """The kept sessions in call order; a call still in flight is dropped when it ends."""
        for _, _, quiet in list(self._live.values()):
            if quiet is not None:
                quiet.close()  # the target gets its stderr back now, whatever that call does
        return [prof for _, prof in self.sessions.close()]


def schedule_roles(wait: int, warmup: int, active: int, repeat: int) -> list[str]:
    return (["wait"] * wait + ["warmup"] * warmup + ["active"] * active) * repeat
