"""``arm --on nan``: the first optimizer step after which a gradient is not finite.

Runs in the training thread, in torch's global optimizer post-step hook (step_clock.py): one
``torch._foreach_norm`` over the gradients the optimizer just used, then one ``isfinite`` of the
stacked norms and one ``.item()``. That is a read of every gradient once per checked step; on a
loop of small ops it would be a few percent, so the check paces itself: it times its own cost
and checks one step in ``every``, with ``every`` chosen so that the checks take at most
:data:`BUDGET` of the training thread's CPU time per step (0.2 %: with the step hook and the
watcher, the whole armed cost stays under ~1 % of a 0.6 ms step; docs/arm.md has the parts). A non-finite gradient turns the parameters non-finite
at that very step, and they stay so: a later check still sees it, and the event says which step
was the last one checked clean ("clean_at_step"), so the NaN appeared in between.

Evidence: the step, the parameters hit first (optimizer group/index, shape, and the name in the
model that holds them, found only when it fires), whether the parameters themselves are still
finite, and every thread's stack. Then the next whole step is watched op by op (nan_locate.py)
and event.json is replaced by one with "located": the op and line that made a NaN out of finite
values, or why none did (the parameters were non-finite already).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any

from ..gc_walk import live_instances
from . import capture
from .base import Trigger
from .evidence import MAX_EVENT_JSON, Event, EvidenceDir
from .nan_locate import Locator

BUDGET = 0.002
_MAX_EVERY = 1000
_MAX_NAMED = 20
# The watched step ends at the next optimizer step; a thread that stops stepping (an evaluation,
# a hang) is not watched for ever: after this many seconds, or 20 step periods if longer.
LOCATE_MAX_S = 10.0


def _grads(optimizer: Any) -> list[tuple[int, int, Any, Any]]:
    out = []
    for g, group in enumerate(getattr(optimizer, "param_groups", ()) or ()):
        for i, p in enumerate(group.get("params", ())):
            grad = getattr(p, "grad", None)
            if grad is not None and not getattr(grad, "is_sparse", False):
                out.append((g, i, p, grad))
    return out


def _finite_flags(torch: Any, optimizer: Any) -> list[Any]:
    """One 0-d tensor per device: whether the sum of every gradient's norm there is finite.
    A non-finite element makes its gradient's norm, and so the sum, non-finite; a finite sum
    that overflows is a false alarm that _confirm clears. ``_foreach_norm`` reads each gradient
    once in one call (fused kernels on a GPU), not one Python op per parameter."""
    grads = [g for _, _, _, g in _grads(optimizer)]
    if not grads:
        return []
    flags = []
    with torch.no_grad():
        by_device: dict[Any, list[Any]] = {}
        for norm in torch._foreach_norm(grads):
            by_device.setdefault(norm.device, []).append(norm)
        for norms in by_device.values():
            flags.append(torch.isfinite(torch.stack(norms).float().sum()))
    return flags


def _to_host(torch: Any, flags: list[Any]) -> tuple[Any, list[Any]]:
    """Start copying device flags to pinned host memory; returns (ready(), host tensors).
    ``ready`` queries an event recorded after the copies (no synchronisation); the flags are
    read on a later step, once the device got there (CUDA's documented Event/non_blocking copy;
    verified on CPU only, with fakes)."""
    host, events = [], []
    cuda: Any = getattr(torch, "cuda", None)
    for flag in flags:
        on_cuda = flag.device.type == "cuda" and cuda is not None
        out = torch.empty((), dtype=torch.bool, pin_memory=on_cuda)
        out.copy_(flag, non_blocking=True)
        host.append(out)
        if on_cuda:
            event = cuda.Event()
            event.record(cuda.current_stream(flag.device))
            events.append(event)

    def ready() -> bool:
        return all(e.query() for e in events)

    return ready, host


def _names(torch: Any, params: list[Any]) -> dict[int, str]:
    """Names of ``params`` in the biggest module holding them (a walk of gc: only on fire)."""
    wanted = {id(p) for p in params}
    best: dict[int, str] = {}
    module_type = getattr(getattr(torch, "nn", None), "Module", None)
    if module_type is None:
        return best
    for obj in live_instances(module_type):
        try:
            found = {id(p): name for name, p in obj.named_parameters() if id(p) in wanted}
        except Exception:
            continue
        if len(found) > len(best):
            best = found
            if len(best) == len(wanted):
                break
    return best


class NanTrigger(Trigger):
    kind = "nan"
    needs_clock = True

    def __init__(self, out: EvidenceDir, max_fires: int, rank: dict[str, Any]) -> None:
        super().__init__(out, max_fires, rank)
        self.every = 1
        self.checks = 0
        self.check_s = 0.0
        self.clean_at: int | None = None
        self._cost: float | None = None
        self._period: float | None = None
        self._cpu_at: float | None = None
        self._step_at = 0
        self._pending: tuple[int, tuple[Any, list[Any]]] | None = None
        # (locator, the event it completes, when it started): the step after a fire, watched
        self._locating: tuple[Locator, str | None, float] | None = None
        self._locate_lock = threading.Lock()
        self.located: dict[str, Any] | None = None

    def detail(self) -> dict[str, Any]:
        return {"checks": self.checks, "every": self.every, "clean_at_step": self.clean_at,
                "check_ms": round(1000 * self.check_s / self.checks, 4) if self.checks else None,
                "locating": self._locating is not None, "located": self.located}

    def _pace(self, spent: float, step_cpu: float | None) -> None:
        """One step in ``every`` checked, so that the checks' share of the training thread's CPU
        time stays under BUDGET. CPU time, not wall time: on a loaded machine both would stretch
        unequally. Both figures are smoothed (a cold check or an odd step must not swing
        ``every`` by a hundred), and the first check, which warms torch's kernels up, is not
        counted."""
        if self.checks == 1 or not step_cpu:
            return
        self._cost = spent if self._cost is None else 0.8 * self._cost + 0.2 * spent
        self._period = step_cpu if self._period is None else 0.8 * self._period + 0.2 * step_cpu
        self.every = max(1, min(_MAX_EVERY, math.ceil(self._cost / (BUDGET * self._period))))

    def on_post_step(self, clock: Any, optimizer: Any, is_step: bool) -> None:
        if self._locating is not None and is_step:
            self._end_locate(clock, None)
        if not self.live or optimizer is None:
            return
        if self._pending is not None:
            self._read_pending(clock, optimizer)
        if clock.steps % self.every:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        t0 = time.thread_time()
        # the training thread's CPU per step since the last check (read on checked steps only)
        step_cpu = ((t0 - self._cpu_at) / (clock.steps - self._step_at)
                    if self._cpu_at is not None and clock.steps > self._step_at else None)
        flags = _finite_flags(torch, optimizer)
        finite = True
        if flags and all(f.device.type == "cpu" for f in flags):
            finite = all(bool(f) for f in flags)  # on the CPU a read is no synchronisation
        elif flags:
            self._pending = (clock.steps, _to_host(torch, flags))
        self._cpu_at = time.thread_time()
        self._step_at = clock.steps
        spent = self._cpu_at - t0
        self.checks += 1
        self.check_s += spent
        self._pace(spent, step_cpu)
        if finite:
            if self._pending is None:
                self.clean_at = clock.steps
            return
        self._confirm(clock, optimizer, torch)

    def _read_pending(self, clock: Any, optimizer: Any) -> None:
        """A device's flags of an earlier check, read once their copy has landed (an event
        query: never a synchronisation). Its step is the one named, not this one."""
        step, (ready, host) = self._pending  # type: ignore[misc]
        if not ready():
            return
        self._pending = None
        if all(bool(h) for h in host):
            self.clean_at = max(self.clean_at or 0, step)
            return
        torch = sys.modules.get("torch")
        if torch is not None:
            self._confirm(clock, optimizer, torch, seen_at=step)

    def _confirm(self, clock: Any, optimizer: Any, torch: Any, seen_at: int | None = None) -> None:
        """The quick check said non-finite (or a finite sum overflowed): look per gradient."""
        grads = _grads(optimizer)
        with torch.no_grad():
            norms = torch._foreach_norm([g for _, _, _, g in grads]) if grads else []
            bad = [k for k, n in enumerate(norms) if not math.isfinite(float(n))]
        if not bad:
            if seen_at is None:
                self.clean_at = clock.steps
            return
        if self.begin_fire():
            try:
                hit = [grads[k] for k in bad]
                final = self.write_event(lambda event: self._capture(event, torch, clock, hit,
                                                                     len(grads), seen_at))
                self._start_locate(torch, final)
            finally:
                hit = []
                self.end_fire()

    # -- the step after a fire, watched op by op (nan_locate.py) ---------------------------------
    def _start_locate(self, torch: Any, final: str | None) -> None:
        if self._locating is not None:
            return
        locator = Locator(torch)
        if locator.start():
            self._locating = (locator, final, time.monotonic())
        elif final is not None:
            self._record_located(final, locator.result(0))

    def busy(self) -> bool:
        return self._locating is not None

    def _take_locating(self) -> tuple[Locator, str | None, float] | None:
        with self._locate_lock:
            taken, self._locating = self._locating, None
        return taken

    def _end_locate(self, clock: Any, cut_short: str | None) -> None:
        """The watched step is over (training thread), or cut short (any thread)."""
        taken = self._take_locating()
        if taken is None:
            return
        locator, final, _ = taken
        if cut_short is None:
            popped = locator.finish()
        else:
            locator.abandon()
            popped = locator.try_pop()
        if not popped and clock is not None:
            clock.defer(locator.try_pop)  # the training thread pops it at its next step
        result = locator.result(clock.steps if clock is not None else 0)
        if cut_short:
            result["cut_short"] = cut_short
        self.located = {k: v for k, v in result.items() if k in ("step", "watched", "found", "reason", "cut_short")}
        if final is not None:
            self._record_located(final, result)

    def _record_located(self, final: str, result: dict[str, Any]) -> None:
        """event.json again, with "located" (a rename: a reader sees the old or the new one)."""
        try:
            fd = os.open(os.path.join(final, "event.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self.out.fd)
            try:
                doc = json.loads(os.read(fd, MAX_EVENT_JSON + 1))
            finally:
                os.close(fd)
            if isinstance(doc, dict):
                doc["located"] = result
                self.out.replace_event_json(final, doc)
        except Exception as exc:
            self._error(f"cannot add the located op to {final}: {type(exc).__name__}: {exc}")

    def tick(self, now: float) -> None:
        taken = self._locating
        if taken is None:
            return
        period = self.clock.last_period if self.clock is not None else None
        limit = max(LOCATE_MAX_S, 20 * (period or 0.0))
        if now - taken[2] > limit:
            self._end_locate(self.clock, f"no step ended within {limit:.0f} s")

    def remove(self) -> list[str]:
        if self._locating is not None:
            self._end_locate(self.clock, "disarmed before the watched step ended")
        return []

    def _capture(self, event: Event, torch: Any, clock: Any, hit: list[Any], total: int,
                 seen_at: int | None) -> dict[str, Any]:
        names = _names(torch, [p for _, _, p, _ in hit[:_MAX_NAMED]])
        params = []
        for g, i, p, grad in hit[:_MAX_NAMED]:
            with torch.no_grad():
                nonfinite = int((~torch.isfinite(grad)).sum())
                param_ok = bool(torch.isfinite(p).all())
            params.append({"name": names.get(id(p)), "group": g, "index": i,
                           "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                           "nonfinite_grad_elements": nonfinite, "grad_elements": int(grad.numel()),
                           "param_finite": param_ok})
        event.write_json("stacks.json", capture.stack_sample())
        where = capture.program_frame(capture.current_frames(skip=2))
        return {"step": clock.steps, "flagged_at_step": seen_at or clock.steps,
                "clean_at_step": self.clean_at, "checked_every": self.every,
                "params_hit": len(hit), "params_checked": total, "first_params": params,
                "where": where, "thread": clock.thread}
