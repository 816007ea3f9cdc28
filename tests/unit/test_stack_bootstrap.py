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


def test_stack_with_progress_reads_each_threads_wakeups_from_the_kernel() -> None:
    # A thread that sleeps in a loop wakes up many times between two samples; one blocked on a
    # lock never does: what job-hang needs to tell a slow loop from a hang on the same line.
    import threading
    import time

    from torch_agent_helpers import run_handler

    stop = threading.Event()
    blocked = threading.Lock()
    blocked.acquire()

    def fp_sleeper() -> None:
        while not stop.is_set():
            time.sleep(0.002)

    threads = [threading.Thread(target=fp_sleeper, name="fp-sleeper", daemon=True),
               threading.Thread(target=blocked.acquire, name="fp-blocked", daemon=True)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # both past their start-up: one sleeping in its loop, one blocked in acquire
    try:
        def sample() -> dict[str, int]:
            result, _ = run_handler("stack", {"progress": True})
            return {t["name"]: t["progress"]["switches"] for t in result["threads"]
                    if t["name"] in ("fp-sleeper", "fp-blocked")}

        first = sample()
        time.sleep(0.3)
        second = sample()
        assert second["fp-sleeper"] - first["fp-sleeper"] >= 20, (first, second)
        assert second["fp-blocked"] == first["fp-blocked"], (first, second)
        plain, _ = run_handler("stack", {})
        assert all("progress" not in t for t in plain["threads"])  # opt-in
    finally:
        stop.set()
        blocked.release()
        for t in threads:
            t.join(5)
