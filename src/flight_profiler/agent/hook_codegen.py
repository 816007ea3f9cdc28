"""The code a hooked function runs instead of its own: generated per set of hooks.

hooks.py decides what to hook and keeps the books; this module writes the wrapper. The wrapper
has the original's signature, free variables, name and kind (function, generator, coroutine,
async generator), binds the arguments exactly as the original would, calls each hook's
``on_enter``, times the original code, and calls each ``on_exit``. Everything it needs (the
original function, the clock, the callbacks) is one constant of its own code, so a call looks
nothing up anywhere.

A lone hook with a gate (hook_gate.py) gets a wrapper with the gate's condition written into
it: a call the condition rejects costs a counter, the condition and the original call, no
function call of ours. Every callback, and every inlined condition, runs behind
``except BaseException``: nothing of ours ends or unwinds the target's thread (shield.py).
"""

from __future__ import annotations

import keyword
import time
import types
from collections.abc import Mapping
from typing import Any, Callable

from .hook_gate import ENTRY, RAISE, RETURN, Gate, inline
from .hook_registry import HOOK_FILE_PREFIX, CodeType, FunctionType, Hook
from .protocol import ERR_USAGE
from .registry import CommandError
from .shield import swallow

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


class _Constants:
    """The wrapper's constants: one code constant, hashed by identity, holding an exact tuple.

    Hashed by identity: code objects hash their constants, and profilers, coverage tools and
    torch.compile key caches by code object, so the wrapper code must stay hashable whatever
    callbacks (say, bound methods of unhashable objects) it holds. The items are an EXACT tuple
    read through a slot: UNPACK_SEQUENCE unpacks only exact tuples directly (3.9-3.13; 3.11+
    specializes on it); a tuple subclass goes through an iterator, which cost every hooked call
    as much as the rest of the no-match path (bench_watch.py filtered: 1.2x -> 1.1x).
    """

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = tuple(items)


# -- wrapper code generation -----------------------------------------------------------------
# The wrapper is generated per set of hooks (rebuilt on every install/remove), so a call pays
# only for its own hooks: no dispatch loop, no per-call lookup of who is listening. The
# constants tuple is unpacked into locals once per call (one operation; every later use is the
# cheapest load there is). A string literal stands for it at compile time and is then replaced.


def _error_counter(hook: Hook) -> Callable[[BaseException], None]:
    """What the wrapper calls when a callback of ``hook`` raised: swallow and count (shield.py)."""
    count = hook.count_error

    def count_error(exc: BaseException) -> None:
        swallow(exc)
        count(exc)

    return count_error


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
            "except BaseException as __fp_x__:",
            f"    __fp_t{i}__ = __fp_failed__",
            f"    __fp_error{i}__(__fp_x__)",
        ]
    lines.append("__fp_c__ = __fp_clock__()")
    return lines


def _exit_lines(hooks: tuple[Hook, ...], value: str, exc: str) -> list[str]:
    lines = ["__fp_n__ = __fp_clock__() - __fp_c__"]
    for i, hook in enumerate(hooks):
        call = [
            "try:",
            f"    __fp_exit{i}__(__fp_t{i}__, {value}, {exc}, __fp_n__)",
            "except BaseException as __fp_x__:",
            f"    __fp_error{i}__(__fp_x__)",
        ]
        if hook.on_enter is not None:
            call = [
                f"if __fp_t{i}__ is not __fp_failed__ and __fp_t{i}__ is not __fp_skip__:",
                *("    " + c for c in call),
            ]
        lines += call
    return lines


def _body(kind: str, hooks: tuple[Hook, ...], pos: str, kw: str, callee: str, call: str) -> list[str]:
    prologue = [f"{', '.join(_constant_names(hooks))}, = {_K!r}.items"]
    return prologue + _main(kind, hooks, pos, kw, callee, call)


def _inlined(kind: str, hooks: tuple[Hook, ...], orig: CodeType) -> _Inline | None:
    """The gate of a lone hook, its conditions rewritten for the wrapper; None if it cannot be."""
    if len(hooks) != 1 or hooks[0].gate is None or kind == "async_generator":
        return None
    gate: Gate = hooks[0].gate
    conditions: dict[str, tuple[str, frozenset[str]]] = {}
    for where, text in ((ENTRY, gate.entry), (RETURN, gate.exit), (RAISE, gate.exit)):
        if text:
            found = inline(text, orig, gate.bound_first, where)
            if found is None:
                return None
            conditions[where] = found
    return _Inline(gate, conditions)


class _Inline:
    """Writes the wrapper body of one gated hook (see hook_gate.py): count, the conditions in
    place, and the callbacks for the calls that pass, each behind ``except BaseException``."""

    # Constants of this layout, in order: the first four are unpacked on every call, the rest
    # (one nested tuple) only by calls that pass the entry test.
    FAST = ("__fp_f__", "__fp_g__", "__fp_fail__", "__fp_k2__")
    REST = ("__fp_clock__", "__fp_nokw__", "__fp_skip__", "__fp_then__", "__fp_pass__",
            "__fp_error__")

    def __init__(self, gate: Gate, conditions: dict[str, tuple[str, frozenset[str]]]) -> None:
        self.gate = gate
        self.conditions = conditions

    def constants(self, orig_function: FunctionType | None, hook: Hook) -> list[Any]:
        gate = self.gate
        rest = (_clock, _NO_KWARGS, SKIP, gate.on_pass_enter, gate.on_pass_exit,
                _error_counter(hook))  # inside the holder: never hashed, an exact tuple
        return [orig_function, gate.state, gate.fail, rest]

    def body(self, kind: str, pos: str, kw: str, callee: str, call: str) -> list[str]:
        gate = self.gate
        how = {"generator": "yield from ", "coroutine": "await "}.get(kind, "")
        run = f"return ({how}{callee}({call}))"
        binds = {"__fp_a__": f"__fp_a__ = ({pos})",
                 "__fp_p__": "__fp_p__ = __fp_a__[1:]" if gate.bound_first else "__fp_p__ = __fp_a__",
                 "__fp_w__": f"__fp_w__ = {{{kw}}}" if kw else "__fp_w__ = __fp_nokw__"}
        lines = [f"{', '.join(self.FAST)}, = {_K!r}.items", "__fp_g__.calls += 1"]
        bound: set[str] = set()
        if ENTRY in self.conditions:
            text, needs = self.conditions[ENTRY]
            if needs:  # __fp_nokw__ comes with the rest
                lines.append(f"{', '.join(self.REST)}, = __fp_k2__")
                bound.add("rest")
            lines += self._bind(needs, binds, bound)
            lines += self._test(text)
            lines += ["if __fp_no__ or __fp_g__.stopped:", "    " + run]
        else:
            lines += ["if __fp_g__.stopped:", "    " + run]
        if "rest" not in bound:
            lines.append(f"{', '.join(self.REST)}, = __fp_k2__")
        token = "(__fp_a__, __fp_w__)"
        if gate.on_pass_enter is not None:
            lines += self._bind({"__fp_a__", "__fp_w__"}, binds, bound)
            lines += [
                "try:",
                "    __fp_t__ = __fp_then__(__fp_a__, __fp_w__)",
                "except BaseException as __fp_x__:",
                "    __fp_error__(__fp_x__)",
                "    " + run,
                "if __fp_t__ is __fp_skip__:",
                "    " + run,
            ]
            token = "__fp_t__"
        lines += [
            "__fp_c__ = __fp_clock__()",
            "try:",
            f"    __fp_r__ = {how}{callee}({call})",
            "except BaseException as __fp_e__:",
            "    __fp_n__ = __fp_clock__() - __fp_c__",
            *("    " + ln for ln in self._exit(RAISE, "None", "__fp_e__", token, binds, set(bound))),
            "    raise",
        ]
        if gate.raised_only:
            return [*lines, "return __fp_r__"]
        return [
            *lines,
            "__fp_n__ = __fp_clock__() - __fp_c__",
            *self._exit(RETURN, "__fp_r__", "None", token, binds, set(bound)),
            "return __fp_r__",
        ]

    def _exit(self, where: str, value: str, exc: str, token: str, binds: dict[str, str],
              bound: set[str]) -> list[str]:
        lines: list[str] = []
        indent = ""
        if where in self.conditions:
            text, needs = self.conditions[where]
            lines += self._bind(needs, binds, bound)
            lines += self._test(text)
            lines.append("if not __fp_no__:")
            indent = "    "
        if token != "__fp_t__":
            lines += [indent + ln for ln in self._bind({"__fp_a__", "__fp_w__"}, binds, bound)]
        lines += [
            indent + "try:",
            indent + f"    __fp_pass__({token}, {value}, {exc}, __fp_n__)",
            indent + "except BaseException as __fp_x__:",
            indent + "    __fp_error__(__fp_x__)",
        ]
        return lines

    @staticmethod
    def _bind(needs: set[str] | frozenset[str], binds: dict[str, str], bound: set[str]) -> list[str]:
        lines = []
        for name in ("__fp_a__", "__fp_p__", "__fp_w__"):  # __fp_p__ is made of __fp_a__
            wanted = name in needs or (name == "__fp_a__" and "__fp_p__" in needs)
            if wanted and name not in bound:
                lines.append(binds[name])
                bound.add(name)
        return lines

    @staticmethod
    def _test(text: str) -> list[str]:
        return [
            "try:",
            f"    __fp_no__ = not {text}",
            "except BaseException as __fp_x__:",
            "    __fp_no__ = __fp_fail__(__fp_x__)",
        ]


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
    inlined = _inlined(kind, hooks, orig)
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
    body = (inlined.body(kind, pos, kw, callee, call) if inlined is not None
            else _body(kind, hooks, pos, kw, callee, call))
    lines += ["        " + ln for ln in body]
    lines.append("    return __fp_wrapper__")
    filename = f"{HOOK_FILE_PREFIX} of {orig.co_filename}:{orig.co_firstlineno}>"
    outer = compile("\n".join(lines) + "\n", filename, "exec", dont_inherit=True)
    wrapper = _find_code(_find_code(outer, "__fp_outer__"), "__fp_wrapper__")
    if inlined is not None:
        constants = inlined.constants(orig_function, hooks[0])
    else:
        constants = [orig_function, _clock, _FAILED, _NO_KWARGS, SKIP]
        for hook in hooks:
            constants += [hook.on_enter, hook.on_exit, _error_counter(hook)]
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


def replace_const(code: CodeType, old: CodeType, new: CodeType) -> CodeType:
    """``code`` with ``old`` replaced by ``new`` anywhere in its constants (recursively)."""
    changed = False
    consts = []
    for const in code.co_consts:
        if const is old:
            const, changed = new, True
        elif isinstance(const, CodeType):
            replaced = replace_const(const, old, new)
            if replaced is not const:
                const, changed = replaced, True
        consts.append(const)
    return code.replace(co_consts=tuple(consts)) if changed else code
