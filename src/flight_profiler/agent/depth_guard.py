"""Bound how deep the agent's code may recurse on a target's thread, whatever the target's
recursion limit.

A target that raised its limit (``sys.setrecursionlimit(10**6)``) trusts its own code not to go
that deep; an expression of ours (a lambda calling itself, ``repr`` of deeply nested data, a
user ``__repr__`` recursing over a long chain) would: CPython 3.9 and 3.10 overflow their C
stack near 20,000 Python frames (8 MB stack), 3.9-3.11 near 50,000 levels of a nested list's
repr, and the process dies of SIGSEGV. 3.12+ bound C recursion themselves, but a million
Python frames still take seconds and a quarter of a gigabyte in the target (3.14 too: 0.8 s
for a lambda calling itself, and the filter of a one-second watch still running at its end).

The recursion limit is one number for the whole interpreter: lowering it while our code runs
would make a deeper thread of the target fail (RecursionError, or "Cannot recover from stack
overflow" if it goes 50 beyond). So the bound is per thread: while our code runs, this thread's
own depth counter in its PyThreadState (``recursion_depth`` on 3.9/3.10, ``recursion_remaining``
on 3.11, ``py_recursion_remaining`` on 3.12 to 3.14: the fields greenlet also saves and restores)
is moved so that only ``HEADROOM`` levels remain below the limit, and moved back afterwards.
The field is found at its offset in the version's ``struct _ts`` and checked before any write:
one Python call deeper must move it by exactly one, its value must be plausible, and from 3.11
on the limit stored beside it must equal ``sys.getrecursionlimit()``. If ctypes is missing or
the check fails, the guard does nothing (``status()`` says why).

Only when the limit is above ``SAFE_LIMIT`` does anything happen: at the default limit (1000)
the interpreter's own check stops any recursion long before the C stack ends.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

HEADROOM = 300  # levels our evaluation may use below the point where the guard is taken
SAFE_LIMIT = 4000  # ~1.6 MB of C stack on 3.9/3.10 (measured ~400 bytes a level): no guard needed
_VERSION = sys.version_info[:2]
_COUNTS_UP = _VERSION in ((3, 9), (3, 10))  # recursion_depth grows; the later "remaining" shrink
ACTIVE = (3, 9) <= _VERSION <= (3, 14)  # a later layout is not guessed
_getlimit = sys.getrecursionlimit
_local = threading.local()
_state = {"broken": ""}  # why the guard cannot work here ("" while it can)


def _field(pointer_size: int) -> int:
    """Offset of the depth counter in ``struct _ts`` (Include/cpython/pystate.h)."""
    if _COUNTS_UP:  # prev, next, interp, frame, then int recursion_depth
        return 4 * pointer_size
    if _VERSION == (3, 11):  # prev, next, interp, int _initialized, int _static, then it
        return 3 * pointer_size + 8
    if _VERSION == (3, 12):  # prev, next, interp, a 4-byte bit field, then it
        return 3 * pointer_size + 4
    # 3.13: prev, next, interp, uintptr_t eval_breaker, 4-byte bit field, int _whence, int state;
    # 3.14 one int more (measured: the counter moves by one a call there, the limit beside it)
    return 4 * pointer_size + (12 if _VERSION == (3, 13) else 16)


def _one_deeper(cell: Any) -> int:
    return int(cell.value)


def _make_cell() -> Any:
    """This thread's depth counter as a ctypes int, checked; None if it cannot be trusted."""
    try:
        import ctypes

        get = ctypes.pythonapi.PyThreadState_Get
        get.restype = ctypes.c_void_p
        address = get()
        if not address:
            raise ValueError("no thread state")
        cell = ctypes.c_int.from_address(address + _field(ctypes.sizeof(ctypes.c_void_p)))
        here, deeper = int(cell.value), _one_deeper(cell)
        limit = _getlimit()
        if _COUNTS_UP:
            plausible = 0 < here <= limit and deeper == here + 1
        else:
            beside = ctypes.c_int.from_address(address + _field(ctypes.sizeof(ctypes.c_void_p)) + 4)
            plausible = 0 < here <= limit and deeper == here - 1 and beside.value == limit
        if not plausible:
            raise ValueError(f"unexpected thread state layout ({here}, {deeper}, limit {limit})")
        return cell
    except Exception as exc:
        _state["broken"] = f"{type(exc).__name__}: {exc}"
        return None


def bounded() -> int:
    """Leave this thread at most HEADROOM levels of recursion; returns what :func:`release`
    must be given back (0: nothing was changed)."""
    limit = _getlimit()
    if limit <= SAFE_LIMIT or not ACTIVE or _state["broken"]:
        return 0
    cell = getattr(_local, "cell", None)
    if cell is None:
        cell = _local.cell = _make_cell()
        if cell is None:
            return 0
    value = int(cell.value)
    room = limit - value if _COUNTS_UP else value
    if room <= HEADROOM:
        return 0
    shift = room - HEADROOM
    cell.value = value + shift if _COUNTS_UP else value - shift
    return shift


def release(shift: int) -> None:
    """Undo :func:`bounded` (on the same thread, in the same frame)."""
    if shift:
        cell = _local.cell
        cell.value = int(cell.value) - shift if _COUNTS_UP else int(cell.value) + shift


def status() -> str:
    """One line for tests and the log: whether the guard works in this process."""
    if not ACTIVE:
        return "not available on this CPython (its thread state layout is not known here)"
    return f"unavailable: {_state['broken']}" if _state["broken"] else "available"
