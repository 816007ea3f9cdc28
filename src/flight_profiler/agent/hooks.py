"""Observe every call of one Python function, in place, and put it back exactly.

``install(target, on_enter, on_exit) -> remove``

* ``on_enter(args, kwargs) -> token`` runs in the calling thread just before the body;
  ``args`` holds the positional parameters as bound (``self`` first for methods) plus any
  ``*args``, ``kwargs`` the keyword-only parameters plus any ``**kwargs`` (a read-only empty
  mapping for functions that take neither: no dict is built per call).
  Returning :data:`SKIP` means "not this call": its ``on_exit`` is not called, and with a
  single hook the call then runs without being timed at all (a filter on arguments costs only
  itself for the calls it rejects).
* ``on_exit(token, return_value, exception_or_None, elapsed_ns)`` runs right after it, in the
  same thread; ``elapsed_ns`` excludes the callbacks' own time.
* Generators, coroutines and async generators: one enter/exit pair per object LIFE. Enter runs
  when the object first starts running (first ``next()``/``send()``/``await``), exit when it
  finishes; ``return_value`` is its ``return`` value (StopIteration's value), ``exception`` what
  ended it (``GeneratorExit`` when it was closed early, e.g. a ``for`` loop's ``break``), and
  ``elapsed_ns`` is wall time from start to end, time spent suspended included.
* Exceptions raised by the callbacks, any ``BaseException`` (``SystemExit``,
  ``KeyboardInterrupt``, ``GeneratorExit`` included), are counted (``Hook.errors``) and
  swallowed: they never end, interrupt or unwind the target's thread. The one exception is what
  the target's own signal handler raised while a callback ran (Ctrl-C): it goes on to the target
  as it would have without us (shield.py). The function's own exceptions pass unchanged.
* ``remove()`` is idempotent; once the last hook of a function is removed its ``__code__`` is
  the very object it was before (identity, not just equality). A call already running when
  ``remove()`` returns may still deliver its ``on_exit`` (callers ignore late exits).
* Several hooks on one function compose (each sees every call) and come off in any order.
* A forked child (a DataLoader worker) gets its functions back unhooked: the agent's threads do
  not survive a fork, so nothing there would ever read an event or remove the hook.

How: the function's ``__code__`` is swapped for a generated wrapper with the same signature,
free variables, name and kind (generator / coroutine / async generator stay what they were,
so ``inspect`` and asyncio see no difference). The wrapper binds arguments exactly as the
original would (defaults live on the function object, which is untouched) and calls the
original code. Because the function object itself changes, every reference sees the hook:
names imported elsewhere, bound methods captured earlier, decorators' references. Functions
not hooked pay nothing: no global trace or profile function is ever set.

A nested function (``-nm``) has no stable function object: it is made anew each time its outer
function runs. The outer function's code constants are rewritten to hold the wrapper code, and
function objects already created from the nested code (found once via ``gc.get_referrers``) are
swapped too.

Why not ``sys.monitoring`` on 3.12+: its PY_START event does not carry the arguments (reading
them back through the frame costs more than this whole wrapper), and PY_UNWIND (a function
ending by an exception) can only be enabled globally, which would make every function in the
process pay. "Disabled locations cost nothing" helps only code nobody needs to see: a filter must
see every call, and the wrapper with the filter written into it (hook_gate.py) rejects one for
less than a monitoring callback costs. trace needs events from every function the traced call
reaches, not one code object's, and monitoring events are interpreter-wide (every thread would
pay), where ``sys.setprofile`` is the calling thread's alone. Measured in bench/bench_watch.py.

Visible while hooked: one extra frame (file ``<flight_profiler hook ...>``) between a caller and
the hooked function in tracebacks and ``sys._getframe``, and ``inspect.getsource`` of the
function fails. Both disappear with the hook.
"""

from __future__ import annotations

import contextlib
import gc
import os
import weakref

from . import hook_registry
from .hook_codegen import SKIP, make_wrapper, replace_const
from .hook_gate import Gate
from .hook_registry import (
    CodeType,
    FunctionType,
    Hook,
    OnEnter,
    OnExit,
    Patch,
    active,
    function_patch,
    original_code,
)
from .protocol import ERR_USAGE
from .registry import CommandError
from .targets import Target

__all__ = ["SKIP", "Hook", "Removal", "active", "install", "original_code"]

# The registry of patched functions lives in hook_registry.py (a leaf: targets.py reads it too).
_lock = hook_registry.lock
_patches = hook_registry.patches


def _set_body(function: FunctionType, code: CodeType) -> None:
    """Give ``function`` new code, underneath our wrapper if it has one."""
    patch = function_patch(function)
    if patch is not None and patch.orig_function is not None:
        patch.orig_function.__code__ = code
        patch.code = code
    else:
        function.__code__ = code


def _swap(patch: Patch, new: CodeType | None) -> None:
    """Replace the installed wrapper by ``new`` (None: by the original code)."""
    old = patch.wrapper
    if not patch.nested:
        if patch.function.__code__ is (old if old is not None else patch.code):
            patch.function.__code__ = new if new is not None else patch.code
        else:
            patch.broken = True
    else:
        current = original_code(patch.function)
        replacement = new if new is not None else patch.code
        updated = replace_const(current, old if old is not None else patch.code, replacement)
        if new is None and patch.outer_before is not None and updated == patch.outer_before:
            updated = patch.outer_before  # identity, not a lookalike
        if updated is not current:
            _set_body(patch.function, updated)
        if old is None:  # first install: closures made before the hook (one gc scan)
            for ref in gc.get_referrers(patch.code):
                if isinstance(ref, FunctionType) and ref.__code__ is patch.code:
                    patch.live.append(weakref.ref(ref))
        for ref in patch.live:
            fn = ref()
            if fn is not None and fn.__code__ is (old if old is not None else patch.code):
                fn.__code__ = replacement
    patch.wrapper = new


def _rebuild(patch: Patch) -> None:
    if not patch.hooks:
        _swap(patch, None)
        return
    wrapper = make_wrapper(patch.code, patch.hooks, patch.orig_function, patch.qualname())
    _swap(patch, wrapper)


def _new_patch(target: Target) -> Patch:
    patch = Patch(target.description, target.function, target.code, target.is_nested)
    function = target.function
    if target.is_nested:
        patch.outer_before = original_code(function)
        if not _contains(patch.outer_before, target.code):
            raise CommandError(
                f"{target.description} is no longer defined in its outer function", "", ERR_USAGE
            )
    else:
        patch.code = function.__code__
        orig = FunctionType(patch.code, function.__globals__, function.__name__, None, function.__closure__)
        orig.__qualname__ = function.__qualname__
        patch.orig_function = orig
    return patch


def _contains(code: CodeType, wanted: CodeType) -> bool:
    return any(
        const is wanted or (isinstance(const, CodeType) and _contains(const, wanted))
        for const in code.co_consts
    )


class Removal:
    """``remove()`` of one installed hook (idempotent); ``.hook`` lets callers read its errors."""

    __slots__ = ("_key", "_patch", "hook")

    def __init__(self, hook: Hook, key: tuple[int, ...], patch: Patch) -> None:
        self.hook = hook
        self._key = key
        self._patch = patch

    def __call__(self) -> None:
        hook, patch = self.hook, self._patch
        with _lock:
            if not hook.active:
                return
            hook.active = False
            patch.hooks = tuple(h for h in patch.hooks if h is not hook)
            if not patch.broken:
                _rebuild(patch)
            if not patch.hooks and _patches.get(self._key) is patch:
                del _patches[self._key]


def install(target: Target, on_enter: OnEnter | None, on_exit: OnExit,
            gate: Gate | None = None) -> Removal:
    """Start observing ``target``; returns ``remove()`` (idempotent).

    ``on_enter`` may be None: the token passed to ``on_exit`` is then ``(args, kwargs)``,
    which spares a call per observed call. ``gate``: the same observer as a filter the wrapper
    runs inline when this is the function's only hook (hook_gate.py); ``on_enter``/``on_exit``
    must do the same on their own, for when it is not.
    """
    hook = Hook(on_enter, on_exit, gate)
    key = (id(target.function), id(target.code)) if target.is_nested else (id(target.function),)
    with _lock:
        patch = _patches.get(key)
        if patch is None:
            patch = _new_patch(target)
        patch.hooks = (*patch.hooks, hook)
        try:
            _rebuild(patch)
        except BaseException:
            patch.hooks = patch.hooks[:-1]
            raise
        _patches[key] = patch
    return Removal(hook, key, patch)


def _forget_in_forked_child() -> None:
    """A fork (a DataLoader worker, say) inherits our hooks but not the agent's threads: nobody
    there would ever read an event or remove them. Give the child its functions back."""
    # Only the forking thread exists in the child; a lock another thread held stays held.
    locked = _lock.acquire(blocking=False)
    try:
        for patch in list(_patches.values()):
            for hook in patch.hooks:
                hook.active = False
            patch.hooks = ()
            if not patch.broken:
                with contextlib.suppress(Exception):  # never break the user's fork
                    _rebuild(patch)
        _patches.clear()
    finally:
        if locked:
            _lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_forked_child)
