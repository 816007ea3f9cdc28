"""CUDA allocation history switched on and off from one agent thread.

torch registers history's annotation callback thread-locally, in the thread that switches
history on, and removes it from whichever thread switches it off: from another thread torch
prints "Requested callback is not found" into the target's stderr (seen on an H100, torch
2.11, with `torch memory -r` and `arm --on oom`), and a callback left on a target's thread
costs it on every record_function. So every switch goes through one thread of ours, started
when history is switched on and ended once it is off again.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_LOCK = threading.Lock()
_OWNER: _Owner | None = None
_WAIT_S = 30.0


class _Owner(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="flight_profiler-cuda-history", daemon=True)
        self.jobs: queue.Queue[tuple[Callable[[], Any], dict[str, Any], threading.Event] | None] = queue.Queue()

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, box, done = job
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed back to the caller, never out of this thread
                box["error"] = exc
            finally:
                del fn
                done.set()


def _on_owner(fn: Callable[[], Any], stop_after: bool) -> Any:
    global _OWNER
    with _LOCK:
        owner = _OWNER
        if owner is None:
            owner = _OWNER = _Owner()
            owner.start()
        box: dict[str, Any] = {}
        done = threading.Event()
        owner.jobs.put((fn, box, done))
        if not done.wait(_WAIT_S):
            raise TimeoutError("CUDA memory history did not switch within 30 s")
        if stop_after:
            owner.jobs.put(None)
            owner.join(_WAIT_S)
            _OWNER = None
    if "error" in box:
        raise box["error"]
    return box.get("value")


def switch_on(torch: Any, max_entries: int) -> None:
    _on_owner(lambda: torch.cuda.memory._record_memory_history(enabled="all", max_entries=max_entries),
              stop_after=False)


def switch_off(torch: Any) -> None:
    _on_owner(lambda: torch.cuda.memory._record_memory_history(enabled=None), stop_after=True)


def owner_thread() -> threading.Thread | None:
    """The thread that switched history on, while it is on (for tests)."""
    return _OWNER
