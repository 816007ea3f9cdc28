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
* Exceptions raised by the callbacks are counted (``Hook.errors``) and swallowed; they never
  reach the target's thread. ``KeyboardInterrupt``/``SystemExit`` belong to the target and pass.
* ``remove()`` is idempotent; once the last hook of a function is removed its ``__code__`` is
  the very object it was before (identity, not just equality). A call already running when
  ``remove()`` returns may still deliver its ``on_exit`` (callers ignore late exits).
* Several hooks on one function compose (each sees every call) and come off in any order.

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
process pay. Measured in bench/bench_watch.py.

Visible while hooked: one extra frame (file ``<flight_profiler hook ...>``) between a caller and
the hooked function in tracebacks and ``sys._getframe``, and ``inspect.getsource`` of the
function fails. Both disappear with the hook.
"""

from __future__ import annotations

import gc
import keyword
import threading
import time
import types
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

from .protocol import ERR_USAGE
from .registry import CommandError
from .targets import HOOK_FILE_PREFIX, Target

CodeType = types.CodeType
FunctionType = types.FunctionType
OnEnter = Callable[[tuple[Any, ...], Mapping[str, Any]], Any]
OnExit = Callable[[Any, Any, Optional[BaseException], int], None]

_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08
_CO_GENERATOR = 0x20
_CO_COROUTINE = 0x80
_CO_ITERABLE_COROUTINE = 0x100
_CO_ASYNC_GENERATOR = 0x200

_K = "__flight_profiler_constants__"  # string constant replaced by the wrapper's constants tuple
_FAILED = object()  # token of a hook whose on_enter raised: its on_exit is skipped


class _Skip:
    __slots__ = ()

    def __repr__(self) -> str:
        return "hooks.SKIP"


SKIP: Any = _Skip()  # what on_enter returns to let a call run unobserved
_clock = time.perf_counter_ns
# Layout of the constants tuple: K[0] the original function (None for nested targets, whose
# original is made per call), K[1] the clock, K[2] _FAILED, K[3] a read-only empty mapping
# (the kwargs of functions without keyword-only parameters or **kwargs: no dict per call),
# K[4] SKIP, then (on_enter, on_exit, count_error) per hook.
_NO_KWARGS: Mapping[str, Any] = types.MappingProxyType({})
_HOOK_BASE = 5


class _Constants(tuple):  # type: ignore[type-arg]
    """The wrapper's constants. Hashed by identity: code objects hash their constants, and
    profilers, coverage tools and torch.compile key caches by code object, so the wrapper code
    must stay hashable whatever callbacks (say, bound methods of unhashable objects) it holds.
    """

    __slots__ = ()
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other


class Hook:
    """One observer of one function (several may share a function)."""

    __slots__ = ("active", "errors", "on_enter", "on_exit")

    def __init__(self, on_enter: OnEnter | None, on_exit: OnExit) -> None:
        self.on_enter = on_enter
        self.on_exit = on_exit
        self.active = True
        self.errors = 0

    def count_error(self) -> None:
        self.errors += 1


# -- wrapper code generation -----------------------------------------------------------------
# The wrapper is generated per set of hooks (rebuilt on every install/remove), so a call pays
# only for its own hooks: no dispatch loop, no per-call lookup of who is listening. The
# constants tuple is unpacked into locals once per call (one operation; every later use is the
# cheapest load there is). A string literal stands for it at compile time and is then replaced.


def _signature_parts(code: CodeType) -> tuple[str, str, str, str]:
    """(def parameters, positional tuple items, kwargs dict items, call arguments)."""
    names = code.co_varnames
    npos, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    positional = list(names[:npos])
    kwonly = list(names[npos : npos + nkw])
    i = npos + nkw
    varargs = names[i] if code.co_flags & _CO_VARARGS else None
    i += 1 if varargs else 0
    varkw = names[i] if code.co_flags & _CO_VARKEYWORDS else None
    for name in [*positional, *kwonly, varargs, varkw]:
        if name and (name.startswith("__fp_") or keyword.iskeyword(name) or not name.isidentifier()):
            raise CommandError(f"cannot hook a function with a parameter named {name!r}", "", ERR_USAGE)
    params: list[str] = list(positional)
    if nposonly:
        params.insert(nposonly, "/")
    if varargs:
        params.append("*" + varargs)
    elif kwonly:
        params.append("*")
    params += kwonly
    if varkw:
        params.append("**" + varkw)
    pos_items = [*positional, *(["*" + varargs] if varargs else [])]
    pos = ", ".join(pos_items) + ("," if len(pos_items) == 1 and not varargs else "")
    kw_items = [f"{n!r}: {n}" for n in kwonly] + (["**" + varkw] if varkw else [])
    call = [*positional, *(["*" + varargs] if varargs else []), *(f"{n}={n}" for n in kwonly)]
    if varkw:
        call.append("**" + varkw)
    return ", ".join(params), pos, ", ".join(kw_items), ", ".join(call)


def _constant_names(hooks: tuple[Hook, ...]) -> list[str]:
    """Local names of the constants tuple's items, in its layout (see ``_HOOK_BASE``)."""
    names = ["__fp_f__", "__fp_clock__", "__fp_failed__", "__fp_nokw__", "__fp_skip__"]
    for i in range(len(hooks)):
        names += [f"__fp_enter{i}__", f"__fp_exit{i}__", f"__fp_error{i}__"]
    return names


def _enter_lines(hooks: tuple[Hook, ...], pos: str, kw: str) -> list[str]:
    lines = [
        f"__fp_a__ = ({pos})",
        f"__fp_w__ = {{{kw}}}" if kw else "__fp_w__ = __fp_nokw__",
    ]
    for i, hook in enumerate(hooks):
        if hook.on_enter is None:  # the token is the arguments themselves: no call at all
            lines.append(f"__fp_t{i}__ = (__fp_a__, __fp_w__)")
            continue
        lines += [
            "try:",
            f"    __fp_t{i}__ = __fp_enter{i}__(__fp_a__, __fp_w__)",
            "except Exception:",
            f"    __fp_t{i}__ = __fp_failed__",
            f"    __fp_error{i}__()",
        ]
    lines.append("__fp_c__ = __fp_clock__()")
    return lines


def _exit_lines(hooks: tuple[Hook, ...], value: str, exc: str) -> list[str]:
    lines = ["__fp_n__ = __fp_clock__() - __fp_c__"]
    for i, hook in enumerate(hooks):
        call = [
            "try:",
            f"    __fp_exit{i}__(__fp_t{i}__, {value}, {exc}, __fp_n__)",
            "except Exception:",
            f"    __fp_error{i}__()",
        ]
        if hook.on_enter is not None:
            call = [
                f"if __fp_t{i}__ is not __fp_failed__ and __fp_t{i}__ is not __fp_skip__:",
                *("    " + c for c in call),
            ]
        lines += call
    return lines


def _body(kind: str, hooks: tuple[Hook, ...], pos: str, kw: str, callee: str, call: str) -> list[str]:
    prologue = [f"__fp_k__ = {_K!r}", f"{', '.join(_constant_names(hooks))}, = __fp_k__"]
    return prologue + _main(kind, hooks, pos, kw, callee, call)


def _main(kind: str, hooks: tuple[Hook, ...], pos: str, kw: str, callee: str, call: str) -> list[str]:
    enter = _enter_lines(hooks, pos, kw)
    if kind == "async_generator":  # no ``yield from`` here: forward asend/athrow/aclose by hand
        loop = [
            f"__fp_g__ = {callee}({call})",
            *enter,
            "try:",
            "    __fp_s__ = __fp_g__.asend",
            "    __fp_v__ = None",
            "    while True:",
            "        try:",
            "            __fp_y__ = await __fp_s__(__fp_v__)",
            "        except StopAsyncIteration:",
            "            break",
            "        __fp_s__ = __fp_g__.asend",
            "        try:",
            "            __fp_v__ = yield __fp_y__",
            "        except GeneratorExit:",
            "            await __fp_g__.aclose()",
            "            raise",
            "        except BaseException as __fp_e__:",
            "            __fp_v__ = __fp_e__",
            "            __fp_s__ = __fp_g__.athrow",
            "except BaseException as __fp_e__:",
            *("    " + ln for ln in _exit_lines(hooks, "None", "__fp_e__")),
            "    raise",
            *_exit_lines(hooks, "None", "None"),
        ]
        return loop
    how = {"generator": "yield from ", "coroutine": "await "}.get(kind, "")
    if len(hooks) == 1 and hooks[0].on_enter is not None:
        # SKIP: run the call as if unhooked, not even timed (the clock costs as much as a filter)
        clock_line = enter.pop()
        enter += [
            "if __fp_t0__ is __fp_skip__:",
            f"    return ({how}{callee}({call}))",
            clock_line,
        ]
    return [
        *enter,
        "try:",
        f"    __fp_r__ = {how}{callee}({call})",
        "except BaseException as __fp_e__:",
        *("    " + ln for ln in _exit_lines(hooks, "None", "__fp_e__")),
        "    raise",
        *_exit_lines(hooks, "__fp_r__", "None"),
        "return __fp_r__",
    ]


def _kind(code: CodeType) -> str:
    flags = code.co_flags
    if flags & _CO_ASYNC_GENERATOR:
        return "async_generator"
    if flags & _CO_COROUTINE:
        return "coroutine"
    if flags & (_CO_GENERATOR | _CO_ITERABLE_COROUTINE):
        return "generator"
    return "function"


def _find_code(code: CodeType, name: str) -> CodeType:
    for const in code.co_consts:
        if isinstance(const, CodeType) and const.co_name == name:
            return const
    raise AssertionError(f"generated code lost {name}")


def make_wrapper(
    orig: CodeType, hooks: tuple[Hook, ...], orig_function: FunctionType | None, qualname: str
) -> CodeType:
    """Wrapper code with ``orig``'s signature, free variables, name and kind, calling ``hooks``.

    ``orig_function`` is the function to call; None makes the wrapper build it from ``orig``
    and its own closure cells on each call (nested targets: each closure differs).
    """
    params, pos, kw, call = _signature_parts(orig)
    kind = _kind(orig)
    free = orig.co_freevars
    lines = ["def __fp_outer__():"]
    if free:
        lines.append("    " + " = ".join(free) + " = None")
    prefix = "async def" if kind in ("coroutine", "async_generator") else "def"
    lines.append(f"    {prefix} __fp_wrapper__({params}):")
    if free:
        lines.append("        nonlocal " + ", ".join(free))
    if orig_function is None:
        lines.append(f"        def __fp_orig__({params}):")
        lines.append(("            nonlocal " + ", ".join(free)) if free else "            pass")
        callee = "__fp_orig__"
    else:
        callee = "__fp_f__"
    lines += ["        " + ln for ln in _body(kind, hooks, pos, kw, callee, call)]
    lines.append("    return __fp_wrapper__")
    filename = f"{HOOK_FILE_PREFIX} of {orig.co_filename}:{orig.co_firstlineno}>"
    outer = compile("\n".join(lines) + "\n", filename, "exec", dont_inherit=True)
    wrapper = _find_code(_find_code(outer, "__fp_outer__"), "__fp_wrapper__")
    constants: list[Any] = [orig_function, _clock, _FAILED, _NO_KWARGS, SKIP]
    for hook in hooks:
        constants += [hook.on_enter, hook.on_exit, hook.count_error]
    consts = []
    for const in wrapper.co_consts:
        if isinstance(const, str) and const == _K:
            const = _Constants(constants)
        elif isinstance(const, CodeType) and const.co_name == "__fp_orig__":
            if const.co_freevars != orig.co_freevars:
                raise CommandError(f"cannot hook {qualname}: unusual free variables", "", ERR_USAGE)
            const = orig
        elif isinstance(const, str) and const.endswith("__fp_orig__"):  # 3.9/3.10 qualname
            const = qualname
        consts.append(const)
    if wrapper.co_freevars != orig.co_freevars:
        raise CommandError(f"cannot hook {qualname}: unusual free variables", "", ERR_USAGE)
    changes: dict[str, Any] = {
        "co_consts": tuple(consts),
        "co_name": orig.co_name,
        "co_flags": wrapper.co_flags | (orig.co_flags & _CO_ITERABLE_COROUTINE),
    }
    if hasattr(orig, "co_qualname"):
        changes["co_qualname"] = orig.co_qualname
    return wrapper.replace(**changes)


def _replace_const(code: CodeType, old: CodeType, new: CodeType) -> CodeType:
    """``code`` with ``old`` replaced by ``new`` anywhere in its constants (recursively)."""
    changed = False
    consts = []
    for const in code.co_consts:
        if const is old:
            const, changed = new, True
        elif isinstance(const, CodeType):
            replaced = _replace_const(const, old, new)
            if replaced is not const:
                const, changed = replaced, True
        consts.append(const)
    return code.replace(co_consts=tuple(consts)) if changed else code


# -- the registry of patched functions -------------------------------------------------------


class _Patch:
    """One hooked function (or nested code), its hooks, and everything needed to undo it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.function = target.function
        self.code = target.code  # the original code being observed
        self.hooks: tuple[Hook, ...] = ()
        self.orig_function: FunctionType | None = None  # non-nested: what the wrapper calls
        self.wrapper: CodeType | None = None  # the wrapper currently installed
        self.outer_before: CodeType | None = None  # nested: outer body before patching
        self.live: list[weakref.ref[FunctionType]] = []
        self.broken = False  # someone else replaced our wrapper: leave theirs alone

    def qualname(self) -> str:
        return getattr(self.code, "co_qualname", None) or self.target.description.split(".", 1)[-1]


_lock = threading.RLock()
_patches: dict[tuple[int, ...], _Patch] = {}


def _function_patch(function: FunctionType) -> _Patch | None:
    return _patches.get((id(function),))


def original_code(function: FunctionType) -> CodeType:
    """The code ``function`` runs when no hook of ours is in the way."""
    with _lock:
        patch = _function_patch(function)
        if patch is not None and patch.orig_function is not None:
            return patch.orig_function.__code__
        return function.__code__


def _set_body(function: FunctionType, code: CodeType) -> None:
    """Give ``function`` new code, underneath our wrapper if it has one."""
    patch = _function_patch(function)
    if patch is not None and patch.orig_function is not None:
        patch.orig_function.__code__ = code
        patch.code = code
    else:
        function.__code__ = code


def _swap(patch: _Patch, new: CodeType | None) -> None:
    """Replace the installed wrapper by ``new`` (None: by the original code)."""
    old = patch.wrapper
    target = patch.target
    if not target.is_nested:
        if patch.function.__code__ is (old if old is not None else patch.code):
            patch.function.__code__ = new if new is not None else patch.code
        else:
            patch.broken = True
    else:
        current = original_code(patch.function)
        replacement = new if new is not None else patch.code
        updated = _replace_const(current, old if old is not None else patch.code, replacement)
        if new is None and updated == patch.outer_before:
            updated = patch.outer_before  # identity, not a lookalike  # type: ignore[assignment]
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


def _rebuild(patch: _Patch) -> None:
    if not patch.hooks:
        _swap(patch, None)
        return
    wrapper = make_wrapper(patch.code, patch.hooks, patch.orig_function, patch.qualname())
    _swap(patch, wrapper)


def _new_patch(target: Target) -> _Patch:
    patch = _Patch(target)
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


def install(target: Target, on_enter: OnEnter | None, on_exit: OnExit) -> Callable[[], None]:
    """Start observing ``target``; returns ``remove()`` (idempotent).

    ``on_enter`` may be None: the token passed to ``on_exit`` is then ``(args, kwargs)``,
    which spares a call per observed call.
    """
    hook = Hook(on_enter, on_exit)
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

    def remove() -> None:
        with _lock:
            if not hook.active:
                return
            hook.active = False
            patch.hooks = tuple(h for h in patch.hooks if h is not hook)
            if not patch.broken:
                _rebuild(patch)
            if not patch.hooks and _patches.get(key) is patch:
                del _patches[key]

    remove.hook = hook  # type: ignore[attr-defined]  # lets callers read hook.errors
    return remove


def active() -> list[str]:
    """Descriptions of the functions currently hooked (for status and tests)."""
    with _lock:
        return [p.target.description for p in _patches.values()]
