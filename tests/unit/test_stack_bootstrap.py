"""`stack` while a pending call is still starting the agent on top of a target thread."""

from __future__ import annotations

import sys

from flight_profiler.agent.commands.stack import _under_bootstrap


def _capture_under_a_bootstrap() -> tuple[object, object]:
    """Run a bootstrap-shaped text the way the injector's pending call runs it."""
    seen: dict[str, object] = {}
    bootstrap = "def run(cb):\n    cb()\nrun(_FP)\n"
    wrapper = ("exec(BOOT, {'__name__': '_flight_profiler_bootstrap', "
               "'_FP': lambda: SEEN.__setitem__('top', sys._getframe())})\n")

    def fp_user_loop() -> None:
        seen["user"] = sys._getframe()
        exec(compile(wrapper, "<string>", "exec"),
             {"__name__": "__main__", "BOOT": bootstrap, "SEEN": seen, "sys": sys})

    fp_user_loop()
    return seen["top"], seen["user"]


def test_the_target_frames_under_a_running_bootstrap_are_shown() -> None:
    top, user = _capture_under_a_bootstrap()
    assert _under_bootstrap(top) is user


def test_a_stack_without_bootstrap_frames_is_left_as_it_is() -> None:
    here = sys._getframe()
    assert _under_bootstrap(here) is here
