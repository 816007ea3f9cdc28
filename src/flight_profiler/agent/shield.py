"""What the agent does with an exception its own code caught on one of the target's threads.

Everything the agent runs on a target's thread (a hook's filter and counters, ``--expr``
expressions, rendering of values, queueing) catches ``BaseException``: an expression calling
``exit(3)`` or ``sys.exit()``, throwing KeyboardInterrupt or GeneratorExit, or a ``__repr__``
doing so, must not end, interrupt or unwind the thread it happens to run on. The error is
counted and shown as that expression's error instead.

One kind is the target's own even when it surfaces in our code: what a signal handler raised
because the signal arrived while our code ran (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's
SystemExit). Swallowing it would make Ctrl-C miss whenever it lands in the microseconds a hook
runs, so :func:`swallow` raises it again. A Python handler shows up in the traceback as a frame
whose code is an installed handler's. The default SIGINT handler is C (no frame of its own): it
raises at whatever bytecode boundary the thread checks for signals, in our frames or in any code
ours calls (``threading.current_thread`` while an event is built, a comprehension of the
expression, a function of the target's). So a KeyboardInterrupt is the target's unless the
innermost frame outside the agent raised it on purpose: a ``raise`` statement, or a ``throw()``
into a generator, seen where it stopped (a yield, or before it started), which are never where
a signal lands. The expression's own KeyboardInterrupt of that kind is its error.
"""

from __future__ import annotations

import opcode
import os
import signal
import sys
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


def _raised_on_purpose(tb: types.TracebackType) -> bool:
    """Did the frame of ``tb`` (a traceback's innermost entry) raise by itself, not a signal?"""
    code, lasti = tb.tb_frame.f_code, tb.tb_lasti
    if lasti < 0:  # thrown into a generator that had not started (3.9, 3.10)
        return True
    raw = code.co_code
    op = opcode.opname[raw[lasti]] if lasti < len(raw) else ""
    if op in _ON_PURPOSE:
        return True
    # 3.13+: thrown into a generator that had not started stops just after its RETURN_GENERATOR
    return (op == "POP_TOP" and bool(code.co_flags & _GENERATOR_FLAGS) and lasti >= 2
            and opcode.opname[raw[lasti - 2]] == "RETURN_GENERATOR")


# Where only a raise statement or a throw() into a generator stops, never a signal (a signal
# lands at calls, jumps and resumes). A throw into a started generator stops at its yield, where
# 3.9 also checks for signals when the generator resumes, and 3.13+ at its RESUME, where a signal
# lands too: there the target's Ctrl-C wins.
_ON_PURPOSE = frozenset({"RAISE_VARARGS", "RETURN_GENERATOR",
                         *(["YIELD_VALUE"] if (3, 10) <= sys.version_info < (3, 13) else [])})
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


def belongs_to_target(exc: BaseException) -> bool:
    """Did a signal handler of the target raise ``exc`` in the middle of our code?"""
    foreign = []
    innermost = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _agents_own(code):
            foreign.append(code)
            innermost = tb
        tb = tb.tb_next
    if foreign:
        handlers = _signal_handler_codes()
        if any(code in handlers for code in foreign):
            return True
    if not isinstance(exc, KeyboardInterrupt):
        return False
    # the agent never raises KeyboardInterrupt itself: in its frames it is the C handler's
    return innermost is None or innermost.tb_next is not None or not _raised_on_purpose(innermost)


def swallow(exc: BaseException) -> None:
    """Call from ``except BaseException`` around the agent's code on a target's thread: returns
    (the caller carries on as if that step failed quietly) unless ``exc`` is the target's own,
    which is raised again."""
    if belongs_to_target(exc):
        raise exc
