"""Marks in a profile that let the report find the training step: the named method's calls and
each optimizer's steps, as ``record_function`` annotations (user_annotation events).

``StepMarks(torch, label)``:

* ``on_enter``/``on_exit`` for hooks.install: each call of the method is wrapped in an
  annotation ``flight_profiler.call#<label>`` (the report places the method inside the step and
  tells a method that IS the step from one that runs inside it, or several times in it);
* ``on_backward_enter``/``on_backward_exit`` for a hook on ``torch.autograd.backward`` (which
  ``Tensor.backward`` calls): each backward pass in an annotation ``flight_profiler.backward``
  (a loop with a hand-written update and no optimizer object steps once per backward); those
  that run inside an optimizer's ``step()`` (an LBFGS closure) are counted apart
  (``closure_backwards``): a PINN's one LBFGS step of ``max_iter=50000`` runs for minutes, and
  a window waiting for optimizer steps to end waited its whole ``--duration`` for none;
* ``on_optimizer_step`` for torch's global optimizer step post-hook: one annotation
  ``flight_profiler.optimizer_step#<k> <Class>`` at the end of every ``step()`` of optimizer
  number ``k`` (numbered in the order they are first seen). torch's own
  ``Optimizer.step#Adam.step`` annotation names the class only: a GAN's two Adam optimizers
  would look like one optimizer stepping twice a step. When the named method is itself an
  optimizer's ``step`` (``LBFGS.step``, closures inside), the post-hook runs after the hooked
  code returns, outside the call's profiler session: torch_profile then wraps each call in
  ``flight_profiler.optimizer_step#named <Class>`` too.

The counts (calls entered and finished, steps per optimizer) are what ``torch profile --window``
waits on. Only ids of optimizers are kept, never the objects (nothing of the target's is held
after the request). The callbacks run in the target's threads: they never raise (hooks.py
swallows what a hook raises; the optimizer hook catches its own).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any, Callable

CALL_MARK = "flight_profiler.call#"
OPTIMIZER_MARK = "flight_profiler.optimizer_step#"
BACKWARD_MARK = "flight_profiler.backward"
# The optimizer number of a mark that wraps each call of a named optimizer step (torch_profile).
NAMED_STEP = "named"
BACKWARD_SPEC = {"module": "torch.autograd", "method": "backward"}


# Frames looked at above a backward pass for an optimizer's step (the closure's own frames, the
# model's, the program's loop): a bound, since the walk runs in the target's thread.
STEP_FRAME_DEPTH = 64


def optimizer_classes(torch: Any, limit: int = 1000) -> list[type]:
    """torch.optim.Optimizer and its subclasses (at most ``limit``), without a walk over gc."""
    base = getattr(getattr(torch, "optim", None), "Optimizer", None)
    if not isinstance(base, type):
        return []
    todo: list[type] = [base]
    seen: dict[type, None] = {}
    while todo and len(seen) < limit:
        cls = todo.pop()
        if cls in seen:
            continue
        seen[cls] = None
        try:
            todo.extend(cls.__subclasses__())
        except TypeError:
            continue
    return list(seen)


def optimizer_step_codes(torch: Any) -> frozenset[Any]:
    """The code objects of every optimizer class's ``step`` and of what wraps it (torch's
    profiling hook, ``_use_grad_for_differentiable``)."""
    codes: set[Any] = set()
    for cls in optimizer_classes(torch):
        fn = cls.__dict__.get("step")
        for _ in range(10):
            code = getattr(fn, "__code__", None)
            if code is None:
                break
            codes.add(code)
            fn = getattr(fn, "__wrapped__", None)
    return frozenset(codes)


def in_optimizer_step(codes: frozenset[Any]) -> bool:
    """Whether the calling thread runs inside an optimizer's ``step()``."""
    if not codes:
        return False
    frame: Any = sys._getframe(1)
    for _ in range(STEP_FRAME_DEPTH):
        if frame is None:
            return False
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


class StepMarks:
    def __init__(self, torch: Any, label: str | None) -> None:
        self._record = torch.autograd.profiler.record_function
        self._call_name = f"{CALL_MARK}{label}" if label else ""
        self._lock = threading.Lock()
        self.entered = 0
        self.finished = 0
        self._optimizers: dict[int, int] = {}  # id(optimizer) -> its number
        self._classes: list[str] = []
        self._paths: list[str] = []  # each optimizer's class as module.qualname
        self.steps: list[int] = []  # steps per optimizer number
        self.backwards = 0
        self.closure_backwards = 0  # of them, those run inside an optimizer's step()
        self.step_codes = optimizer_step_codes(torch)  # every optimizer class's step()
        # Called first in each mark's hook, in the thread that reached it: a step boundary, where
        # a session may be stopped (profiler_sessions.BoundaryStop.boundary).
        self.boundary: Callable[[], None] | None = None

    # -- the method --------------------------------------------------------------------------
    def on_enter(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if self.boundary is not None:
            self.boundary()
        with self._lock:
            self.entered += 1
        mark = self._record(self._call_name)
        mark.__enter__()
        return mark

    def on_exit(self, token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if token is not None:
            token.__exit__(None, None, None)
        with self._lock:
            self.finished += 1

    # -- backward --------------------------------------------------------------------------
    def on_backward_enter(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if self.boundary is not None:
            self.boundary()
        mark = self._record(BACKWARD_MARK)
        mark.__enter__()
        return (mark, in_optimizer_step(self.step_codes))

    def on_backward_exit(self, token: Any, value: Any, exc: BaseException | None,
                         elapsed_ns: int) -> None:
        if token is not None:
            token[0].__exit__(None, None, None)
        with self._lock:
            self.backwards += 1
            if token is not None and token[1]:
                self.closure_backwards += 1

    def backward_steps(self, after: float, elapsed: float) -> int | None:
        """Backward passes as the steps, where no optimizer step ended (yet) in ``elapsed``
        seconds but, after ``after`` seconds, backward passes ran inside an optimizer's step
        (its closure): a step that outlasts the window (a PINN's LBFGS, max_iter=50000) ends in
        none of it, and the report then finds the steps from the backward passes. None
        otherwise."""
        with self._lock:
            if self.steps or elapsed < after or not self.closure_backwards:
                return None
            return self.closure_backwards

    # -- the optimizers ----------------------------------------------------------------------
    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.boundary is not None:
                self.boundary()
            with self._lock:
                number = self._optimizers.get(id(optimizer))
                if number is None:
                    number = self._optimizers[id(optimizer)] = len(self._classes)
                    self._classes.append(type(optimizer).__name__)
                    self._paths.append(f"{type(optimizer).__module__}.{type(optimizer).__qualname__}")
                    self.steps.append(0)
                self.steps[number] += 1
            with self._record(f"{OPTIMIZER_MARK}{number} {self._classes[number]}"):
                pass
        except Exception:  # never into the target's step()
            pass

    def optimizer_steps(self) -> dict[str, int]:
        with self._lock:
            return {f"#{k} {cls}": n for k, (cls, n) in enumerate(zip(self._classes, self.steps))}

    def optimizer_classes(self) -> dict[str, str]:
        """Each optimizer's mark (as in optimizer_steps) -> its class as module.qualname: what a
        later request names as the step (`torch grads torch.optim.adam Adam step`)."""
        with self._lock:
            return {f"#{k} {cls}": path for k, (cls, path) in enumerate(zip(self._classes, self._paths))}

    def fewest_steps(self) -> int | None:
        """Steps of the optimizer that stepped least (None: no optimizer stepped)."""
        with self._lock:
            return min(self.steps) if self.steps else None


def hook_optimizers(torch: Any, marks: StepMarks) -> Callable[[], None] | None:
    """Install ``marks.on_optimizer_step`` as a global optimizer post-hook; returns its remover,
    or None where this torch has no global hooks (the report then finds steps from torch's own
    Optimizer.step annotations)."""
    module = sys.modules.get("torch.optim.optimizer")
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None:
        return None
    handle = register(marks.on_optimizer_step)
    return handle.remove  # type: ignore[no-any-return]


# Wrappers walked down from an optimizer class's ``step`` to the function a target names
# (torch's profiling hook, ``_use_grad_for_differentiable``): a bound on a foreign chain.
WRAPPED_DEPTH = 8


def _wraps(function: Any, wanted: Any) -> bool:
    for _ in range(WRAPPED_DEPTH):
        if function is wanted:
            return True
        function = getattr(function, "__wrapped__", None)
        if function is None:
            return False
    return False


def after_named_step(owner: Any, function: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
    """Where ``owner.step`` is an optimizer's step that runs torch's step hooks and ``function``
    is what it wraps (the method a user names: ``torch.optim.lbfgs LBFGS step``), ``callback()``
    as a global optimizer post-hook, run right after each of those steps' bodies return; its
    remover, else None (no optimizer of that class built yet: torch wraps ``step`` in the first
    one's ``__init__``).

    Why: a hook swapped into the method's code sees only calls entered after it; this one
    also ends the step running now. A census "after the next call" of a 300 ms LBFGS step
    waited 1.5 steps on average (0.45 s) and takes half a step (3 censuses a diagnosis)."""
    optim = sys.modules.get("torch.optim.optimizer")
    register = getattr(optim, "register_optimizer_step_post_hook", None)
    base = getattr(optim, "Optimizer", None)
    if (register is None or not isinstance(owner, type) or not isinstance(base, type)
            or not issubclass(owner, base)):
        return None
    step = owner.__dict__.get("step", getattr(owner, "step", None))
    if not getattr(step, "hooked", False) or not _wraps(step, function):
        return None

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if _wraps(getattr(type(optimizer), "step", None), function):
                callback()
        except Exception:  # never into the target's step
            pass

    handle = register(post)
    return handle.remove  # type: ignore[no-any-return]
