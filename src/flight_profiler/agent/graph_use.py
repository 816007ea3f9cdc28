"""Whether the graphs a method's calls build are used by a backward, over a window of live calls.

A ``saved_tensors_hooks`` pair is entered around each call in the calling thread (as
graph_cost.py does for ``torch grads``): ``pack`` counts what the call saves for backward. The
``unpack`` hook stays with each saved tensor in the graph and counts every read a backward makes,
also after the call returned. A training forward's graph is read by the backward that follows
it; an evaluation pass written without ``torch.no_grad()`` saves and nobody ever reads. So, at
the end of the window: calls with grad on that saved tensors, and whether a backward read any.

A call is judged only when a later call in the same thread had its graph read, and a backward
that began after the call (in the same thread) has ended: the backward of the window's last
calls may still be to come. A later call read is not enough on its own: a WGAN's critic step
reads its gradient penalty's graph by ``autograd.grad`` before its backward reads the step's
other graphs, and a window closing between the two judged three healthy calls unread (CI of
stop 37: "3 of 259 calls"). Over a window of seconds (diagnose's live look at the loop) this
sees work done once an epoch (a validation pass) that a profile of 3-5 steps only holds by
chance.

Nothing of the target is kept: per call a few integers and the caller's file, line and function
name (strings). The hook functions stay with the saved tensors of the graphs built during the
window until those graphs are freed (a step or two later); they count, and keep autograd as it
was (graph_cost.faithful_pack: no reference cycle, and the in-place check torch skips under
hooks).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

from . import graph_cost

MAX_CALLS = 4096
_TORCH_DIRS = ("/torch/", "\\torch\\")


class _Call:
    __slots__ = ("_seen", "grad", "index", "read", "saved", "saved_bytes", "thread", "where")

    def __init__(self, index: int, thread: int, grad: bool) -> None:
        self.index = index
        self.thread = thread
        self.grad = grad
        self.saved = 0
        self.saved_bytes = 0
        self.read = 0
        self.where: tuple[str, int, str] | None = None
        self._seen: set[int] | None = set()


def _caller() -> tuple[str, int, str] | None:
    """The innermost frame of the program's own code that led to the call: not torch (a
    module's __call__, DDP's forward), not the agent nor our hooks' generated code (the method's
    own frame is not on the stack yet)."""
    f: Any = sys._getframe(2)
    agent = __file__.rsplit("/", 1)[0]
    for _ in range(40):
        if f is None:
            return None
        name = f.f_code.co_filename
        if (not name.startswith("<") and not name.startswith(agent)
                and not any(d in name for d in _TORCH_DIRS)):
            return (name, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


class GraphUse:
    """Hook pair for hooks.install: ``on_enter`` / ``on_exit`` around each call."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.calls: list[_Call] = []
        self.closed = False
        self.started = time.monotonic()
        self.ended: float | None = None
        self._depth = threading.local()
        self._lock = threading.Lock()
        self._backwards = 0
        # Per thread: the calls made before a backward that has since ended (their graphs had a
        # backward to read them).
        self._backward_done: dict[int, int] = {}
        # Seconds spent in these hooks (the calls', pack's and unpack's own time): they lengthen
        # the loop the DataLoader's share is timed on meanwhile (NextTimer takes them out): a
        # WGAN's loop followed through both models' forwards, 0.12 s of a 5 s sample. Updated
        # under the GIL from the target's threads: a rare lost addition costs microseconds of
        # accuracy, never correctness.
        self.overhead_s = 0.0

    def on_enter(self, args: Any, kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._enter()
        finally:
            self.overhead_s += time.perf_counter() - t0

    def _enter(self) -> Any:
        if self.closed:
            return None
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth:  # a call inside a call of the method: the outer one counts
            return None
        try:
            grad = bool(self.torch.is_grad_enabled())
            with self._lock:
                if len(self.calls) >= MAX_CALLS:
                    return None
                rec = _Call(len(self.calls), threading.get_ident(), grad)
                self.calls.append(rec)
            if not grad:
                return (rec, None)
            rec.where = _caller()

            def pack(t: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    if not (t.is_leaf and t.requires_grad):
                        rec.saved += 1
                        seen = rec._seen
                        if seen is not None:
                            st = t.untyped_storage()
                            key = st.data_ptr()
                            if key not in seen:
                                seen.add(key)
                                rec.saved_bytes += st.nbytes()
                except Exception:  # never into the target's op
                    pass
                packed = graph_cost.faithful_pack(t)
                self.overhead_s += time.perf_counter() - t0
                return packed

            def unpack(packed: Any) -> Any:
                t0 = time.perf_counter()
                rec.read += 1
                try:
                    return graph_cost.faithful_unpack(packed)
                finally:
                    self.overhead_s += time.perf_counter() - t0

            ctx = self.torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            ctx.__enter__()
            return (rec, ctx)
        except Exception:
            return None

    def on_exit(self, token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        t0 = time.perf_counter()
        self._depth.n = max(0, getattr(self._depth, "n", 1) - 1)
        if token is not None:
            rec, ctx = token
            rec._seen = None
            if ctx is not None:
                with contextlib.suppress(Exception):
                    ctx.__exit__(None, None, None)
        self.overhead_s += time.perf_counter() - t0

    def close(self) -> None:
        """No new calls are counted; reads of the graphs already built still are."""
        self.closed = True
        self.ended = time.monotonic()

    # -- backward passes in flight -----------------------------------------------------------
    # A backward reads the graphs of a step newest first: one taken over an actor-critic
    # episode's 500 forwards reads call 500 before call 1. A summary taken while it runs would
    # judge calls 1..k unread (a later call's graph was read) although the same backward is
    # about to read them: an eval-with-grad false alarm on a healthy loop (seen: 32 of 2612).
    # So the backwards running when the window closes are waited for (bounded) first.
    def on_backward_enter(self, args: Any, kwargs: Any) -> Any:
        with self._lock:
            self._backwards += 1
            return (threading.get_ident(), len(self.calls))

    def on_backward_exit(self, token: Any, value: Any, exc: BaseException | None,
                         elapsed_ns: int) -> None:
        if token is None:
            return
        thread, made = token
        with self._lock:
            self._backwards -= 1
            if made > self._backward_done.get(thread, 0):
                self._backward_done[thread] = made

    def settle(self, timeout: float, cancelled: Any = None) -> bool:
        """Wait until no backward seen starting is still running (at most ``timeout`` s);
        False if one still was (a rank waiting for its peers' all-reduce)."""
        deadline = time.monotonic() + timeout
        while self._backwards > 0:
            if time.monotonic() >= deadline or (cancelled is not None and cancelled()):
                return False
            time.sleep(0.005)
        return True

    def summary(self, target: str) -> dict[str, Any]:
        """Plain data: calls, those judged, those whose graphs no backward read, and where."""
        with self._lock:
            calls = list(self.calls)
            done = dict(self._backward_done)
        last_read: dict[int, int] = {}
        for c in calls:
            if c.read:
                last_read[c.thread] = c.index
        judged = [c for c in calls if c.grad and c.saved and c.index < last_read.get(c.thread, -1)
                  and c.index < done.get(c.thread, 0)]
        unused = [c for c in judged if not c.read]
        run = longest = 0
        for c in judged:
            run = run + 1 if not c.read else 0
            longest = max(longest, run)
        places: dict[tuple[str, int, str], int] = {}
        for c in unused:
            if c.where is not None:
                places[c.where] = places.get(c.where, 0) + 1
        where = [{"file": f, "line": ln, "function": fn, "calls": n}
                 for (f, ln, fn), n in sorted(places.items(), key=lambda kv: -kv[1])[:3]]
        mean = sum(c.saved_bytes for c in unused) // len(unused) if unused else 0
        return {
            "target": target,
            "window_s": round((self.ended or time.monotonic()) - self.started, 3),
            "calls": len(calls),
            "grad_calls": sum(1 for c in calls if c.grad),
            "no_grad_calls": sum(1 for c in calls if not c.grad),
            "judged": len(judged),
            "used": len(judged) - len(unused),
            "unused": len(unused),
            "longest_unused_run": longest,
            "unused_saved_bytes_per_call": mean,
            "unused_where": where,
            "capped": len(calls) >= MAX_CALLS,
        }
