"""How long one request may take before the CLI stops waiting: its own time limit (what its
options let it run: watch's --timeout, profile's --duration, dataloader's --sample...) plus a
margin for the answer (docs/commands.md, "Deadlines and limits").

The agent lives in someone else's process: a stuck target (a thread holding the GIL) or a fake
agent that says hello and then nothing must not hold a command for ever. At the deadline the
request is cancelled (the agent removes its hooks and sends what it has); without an answer
within the cancel grace the connection is closed. A stream with no limit of its own (watch or
trace without --timeout) runs until Ctrl-C, unless the caller gives a deadline.
"""

from __future__ import annotations

import math

from flight_profiler.requests.base import AgentRequest

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

# Commands that only read a little state answer in milliseconds (watch and trace: their final
# answer, once their own --timeout is reached); the margin covers a target whose threads keep
# the agent's waiting for the GIL for a while.
QUICK_MARGIN_S = 30.0
# Commands that walk every object, export a trace or write a snapshot take longer on big jobs.
WORK_MARGIN_S = 300.0
QUICK = frozenset(("status", "stack", "detach", "torch fr", "watch", "trace", "arm", "disarm"))
_DEFAULT_CALLS_TIMEOUT_S = 60.0  # the torch commands' own --timeout default


def _seconds(args: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    value = float(value)
    return value if math.isfinite(value) and value > 0 else default


def own_limit(request: AgentRequest) -> float | None:
    """Seconds the request's options let it run (0: it answers at once); None: a stream that
    runs until it is stopped (watch or trace without --timeout)."""
    cmd, args = request.cmd, request.args
    if cmd in ("watch", "trace"):
        limit = _seconds(args, "timeout")
        return limit if limit > 0 else None
    if cmd == "torch memory":
        return _seconds(args, "timeout", _DEFAULT_CALLS_TIMEOUT_S) if args.get("mode") == "record" else 0.0
    if cmd == "torch profile":
        if "duration" in args:
            return _seconds(args, "duration")
        return _seconds(args, "timeout", _DEFAULT_CALLS_TIMEOUT_S)
    if cmd == "torch grads":
        if args.get("target"):
            return _seconds(args, "timeout", _DEFAULT_CALLS_TIMEOUT_S)
        return _seconds(args, "calls", 1.0) * _seconds(args, "interval", 1.0)
    if cmd == "torch anomaly":
        return _seconds(args, "timeout", _DEFAULT_CALLS_TIMEOUT_S)
    if cmd == "torch dataloader":
        return max(_seconds(args, "sample", 1.0), _seconds(args, "sample_if_none"))
    return 0.0


def margin(request: AgentRequest) -> float:
    return QUICK_MARGIN_S if request.cmd in QUICK else WORK_MARGIN_S


def deadline(request: AgentRequest) -> float | None:
    """The seconds after which the request is cancelled (None: until it is stopped)."""
    limit = own_limit(request)
    return None if limit is None else limit + margin(request)
