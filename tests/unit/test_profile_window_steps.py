"""agent/profile_window.py: when a window around a method's calls has seen enough of the step.

A forward called hundreds of times an episode (pytorch/examples' actor-critic) had its 4 calls
in long before the episode's backward and optimizer step: the window closed on forwards alone,
the report took the forward for the step and called its graphs unused (eval-with-grad on a
healthy program, 3 runs of 3)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from flight_profiler.agent import profile_window  # noqa: E402
from flight_profiler.agent.step_marks import StepMarks  # noqa: E402


def _marks(entered: int, steps: list[int], backwards: int = 0) -> Any:
    marks = StepMarks(torch, "f")
    marks.entered = marks.finished = entered
    marks.steps = list(steps)
    marks.backwards = backwards
    return marks


def test_calls_in_but_no_step_yet_waits_while_the_program_trains() -> None:
    enough = profile_window._enough
    # 4 forwards of an episode, no backward nor optimizer step yet: not enough, up to soft
    assert not enough(_marks(4, []), 3, 0.5, 5.0, trains=True)
    assert not enough(_marks(400, []), 3, 4.9, 5.0, trains=True)
    assert enough(_marks(400, []), 3, 5.0, 5.0, trains=True)  # bounded: soft seconds
    # the episodes end: the optimizer's whole steps as before
    assert not enough(_marks(40, [2]), 3, 1.0, 5.0, trains=True)
    assert enough(_marks(40, [4]), 3, 1.0, 5.0, trains=True)
    # a method that is the region of a step with its optimizer stepping: unchanged
    assert enough(_marks(4, [4]), 3, 0.1, 5.0, trains=True)


def test_without_an_optimizer_backwards_are_the_steps_and_inference_waits_briefly() -> None:
    enough = profile_window._enough
    # a character RNN with a hand-written update: forwards, then a backward a word
    assert not enough(_marks(7, [], backwards=1), 3, 0.05, 5.0, trains=False)
    assert enough(_marks(28, [], backwards=4), 3, 0.2, 5.0, trains=False)
    # an inference loop: no backward ever; the window ends after NO_STEP_WAIT_S
    assert not enough(_marks(50, []), 3, 0.5, 5.0, trains=False)
    assert enough(_marks(100, []), 3, profile_window.NO_STEP_WAIT_S, 5.0, trains=False)


def test_an_optimizer_built_is_seen_from_the_classes() -> None:
    # in a fresh interpreter: this one's other tests may have built optimizers already
    code = ("import torch; from flight_profiler.agent.profile_window import builds_optimizers as b; "
            "before = b(torch); torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]); "
            "print(before, b(torch))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_gradient_accumulation_waits_for_the_optimizer_not_the_first_backward() -> None:
    # 4 micro-batches a step: their backwards come before the optimizer's first step
    assert not profile_window._enough(_marks(4, [], backwards=3), 3, 0.3, 5.0, trains=True)
    assert profile_window._enough(_marks(16, [4], backwards=16), 3, 0.9, 5.0, trains=True)


def test_backward_passes_inside_an_optimizer_step_are_counted_apart() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.LBFGS([w], max_iter=3)
    marks = StepMarks(torch, None)

    def backward(loss: Any) -> None:
        token = marks.on_backward_enter((), {})
        loss.backward()
        marks.on_backward_exit(token, None, None, 0)

    def closure() -> Any:
        opt.zero_grad()
        loss = (w ** 2).sum()
        backward(loss)
        return loss

    opt.step(closure)
    inside = marks.closure_backwards
    backward((w * 3).sum())  # a plain loop's backward, outside any step()
    assert inside >= 2
    assert marks.closure_backwards == inside and marks.backwards == inside + 1


def test_a_step_that_outlasts_the_window_has_its_closures_as_steps() -> None:
    # a PINN: ONE LBFGS step of max_iter=50000 runs for minutes; its closure (two forwards and a
    # backward) is what repeats. The window waited --duration for an optimizer step to end.
    enough = profile_window._enough
    pinn = _marks(44, [], backwards=22)
    pinn.closure_backwards = 22
    assert not enough(pinn, 5, 0.5, 5.0, trains=True)  # an LBFGS step of a few closures may end
    assert enough(pinn, 5, profile_window.CLOSURE_STEPS_AFTER_S, 5.0, trains=True)
    # once an optimizer step ends in the window, optimizer steps are the steps again
    pinn.steps = [1]
    assert not enough(pinn, 5, 2.0, 5.0, trains=True)
    # backward passes outside any optimizer step, in a program that has one: still wait for it
    plain = _marks(44, [], backwards=22)
    assert not enough(plain, 5, 2.0, 5.0, trains=True)
