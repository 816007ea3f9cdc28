"""What the agent does with an exception its own code caught on one of the target's threads.

Everything the agent runs on a target's thread (a hook's filter and counters, ``--expr``
expressions, rendering of values, queueing) catches ``BaseException``: an expression calling
``exit(3)`` or ``sys.exit()``, throwing KeyboardInterrupt or GeneratorExit, or a ``__repr__``
doing so, must not end, interrupt or unwind the thread it happens to run on. The error is
counted and shown as that expression's error instead.

One kind is the target's own even when it surfaces in our code: what a signal handler raised
because the signal arrived while our code ran (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's
SystemExit). Swallowing it would make Ctrl-C miss whenever it lands in the microseconds a hook
runs, so :func:`swallow` raises it again. A handler runs at a bytecode boundary of whatever
code is running: the default SIGINT handler is C (no frame of its own), so a KeyboardInterrupt
whose traceback holds only the agent's own frames came from it; a Python handler shows up as a
frame whose code is an installed handler's. An expression's own frames (a generator it throws
into, a lambda, ``exec``) are not the agent's: what they raise is the expression's error.
"""

from __future__ import annotations

import os
import signal
import types

OWN_FILE_PREFIX = "<flight_profiler"  # file name of code the agent generates (hook wrappers)
_AGENT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Files of the code watch/trace compile from a request; only the functions the agent wraps
# around the expression (named __fp_*) are its own, not what the expression itself defines.
EXPRESSION_FILES = ("<-f>", "<--expr>")


def _agents_own(code: types.CodeType) -> bool:
    name = code.co_filename
    if name in EXPRESSION_FILES:
        return code.co_name.startswith("__fp_")
    return name.startswith(_AGENT_DIR) or name.startswith(OWN_FILE_PREFIX)


def _signal_handler_codes() -> set[types.CodeType]:
    codes = set()
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError, RuntimeError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if isinstance(code, types.CodeType):
            codes.add(code)
    return codes


def belongs_to_target(exc: BaseException) -> bool:
    """Did a signal handler of the target raise ``exc`` in the middle of our code?"""
    foreign = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _agents_own(code):
            foreign.append(code)
        tb = tb.tb_next
    if not foreign:
        return isinstance(exc, KeyboardInterrupt)
    handlers = _signal_handler_codes()
    return any(code in handlers for code in foreign)


def swallow(exc: BaseException) -> None:
    """Call from ``except BaseException`` around the agent's code on a target's thread: returns
    (the caller carries on as if that step failed quietly) unless ``exc`` is the target's own,
    which is raised again."""
    if belongs_to_target(exc):
        raise exc
