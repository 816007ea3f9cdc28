"""``arm --on nan``: the first optimizer step after which a gradient is not finite.

Runs in the training thread, in torch's global optimizer post-step hook (step_clock.py): one
``torch._foreach_norm`` over the gradients the optimizer just used, then one ``isfinite`` of the
stacked norms and one ``.item()``. That is a read of every gradient once per checked step; on a
loop of small ops it would be a few percent, so the check paces itself: it times its own cost
and checks one step in ``every``, with ``every`` chosen so that the checks take at most
:data:`BUDGET` of the training thread's CPU time per step (0.3 %; with the step hooks, ~7 us a step, the
whole armed cost stays under 1 % of a 1 ms step). A non-finite gradient turns the parameters non-finite
at that very step, and they stay so: a later check still sees it, and the event says which step
was the last one checked clean ("clean_at_step"), so the NaN appeared in between.

Evidence: the step, the parameters hit first (optimizer group/index, shape, and the name in the
model that holds them, found only when it fires), whether the parameters themselves are still
finite, and every thread's stack.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from ..gc_walk import live_instances
from . import capture
from .base import Trigger
from .evidence import Event, EvidenceDir

BUDGET = 0.003
_MAX_EVERY = 1000
_MAX_NAMED = 20


def _grads(optimizer: Any) -> list[tuple[int, int, Any, Any]]:
    out = []
    for g, group in enumerate(getattr(optimizer, "param_groups", ()) or ()):
        for i, p in enumerate(group.get("params", ())):
            grad = getattr(p, "grad", None)
            if grad is not None and not getattr(grad, "is_sparse", False):
                out.append((g, i, p, grad))
    return out


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

    def detail(self) -> dict[str, Any]:
        return {"checks": self.checks, "every": self.every, "clean_at_step": self.clean_at,
                "check_ms": round(1000 * self.check_s / self.checks, 4) if self.checks else None}

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
        if not self.live or optimizer is None or clock.steps % self.every:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        t0 = time.thread_time()
        # the training thread's CPU per step since the last check (read on checked steps only)
        step_cpu = ((t0 - self._cpu_at) / (clock.steps - self._step_at)
                    if self._cpu_at is not None and clock.steps > self._step_at else None)
        grads = _grads(optimizer)
        bad: list[int] = []
        if grads:
            with torch.no_grad():
                norms = torch._foreach_norm([g for _, _, _, g in grads])
                if not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
                    bad = [k for k, n in enumerate(norms) if not math.isfinite(float(n))]
        self._cpu_at = time.thread_time()
        self._step_at = clock.steps
        spent = self._cpu_at - t0
        self.checks += 1
        self.check_s += spent
        self._pace(spent, step_cpu)
        if not bad:
            self.clean_at = clock.steps
            return
        if self.begin_fire():
            try:
                hit = [grads[k] for k in bad]
                self.write_event(lambda event: self._capture(event, torch, clock, hit, len(grads)))
            finally:
                hit = []
                self.end_fire()

    def _capture(self, event: Event, torch: Any, clock: Any, hit: list[Any], total: int) -> dict[str, Any]:
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
        return {"step": clock.steps, "clean_at_step": self.clean_at, "checked_every": self.every,
                "params_hit": len(hit), "params_checked": total, "first_params": params,
                "where": where, "thread": clock.thread}
