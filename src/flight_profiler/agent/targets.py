"""Find the Python function a user named as ``module [class] method [-nm nested]``.

Only modules the target has already imported are searched: importing the user's modules from
the agent could run their top-level code a second time. A typo is answered with the names that
do exist nearby (difflib), never with a traceback.

What can be targeted: module-level functions, methods, classmethods, staticmethods, property
getters, async functions, generators and async generators (all of these are plain Python
functions underneath), functions defined inside another one (``nested``: found through the
outer code object's constants), and anything in ``__main__``. Decorators that follow the
``functools.wraps`` convention are looked through (``__wrapped__``), so ``@torch.no_grad()``
methods resolve to the user's own function.
"""

from __future__ import annotations

import difflib
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from .hook_registry import HOOK_FILE_PREFIX, original_code
from .protocol import ERR_NOT_FOUND, ERR_USAGE
from .registry import CommandError

FunctionType = types.FunctionType
CodeType = types.CodeType


@dataclass
class Target:
    """One resolved target: the function to hook and how to describe it."""

    description: str  # e.g. "__main__.Trainer.step"
    kind: str  # function | method | classmethod | staticmethod | property | nested
    code: CodeType  # the code object whose calls are observed
    # The function object whose ``__code__`` is swapped. For a nested target this is the
    # OUTER function (its code's constants hold ``code``), see hooks.py.
    function: FunctionType
    # True when the first parameter is the bound instance or class (self / cls).
    bound_first: bool = False
    # For nested targets: names from the outer function down to the target, e.g. ("inner",).
    nested_path: tuple[str, ...] = field(default_factory=tuple)
    note: str = ""  # e.g. "defined in base class Base"

    @property
    def is_nested(self) -> bool:
        return bool(self.nested_path)


def _not_found(what: str, name: str, where: str, candidates: list[str]) -> CommandError:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    message = f"no {what} {name!r} in {where}"
    if close:
        message += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    public = sorted(c for c in candidates if not c.startswith("_"))
    hint = ""
    if public:
        shown = ", ".join(public[:12]) + (", ..." if len(public) > 12 else "")
        hint = f"{where} has: {shown}"
    return CommandError(message, hint, ERR_NOT_FOUND)


def _find_module(name: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        close = difflib.get_close_matches(name, list(sys.modules), n=3, cutoff=0.7)
        hint = (
            "did you mean " + " or ".join(repr(c) for c in close) + "?"
            if close
            else "the agent never imports your modules; name one the program has imported "
            "(the script itself is `__main__`)"
        )
        raise CommandError(f"module {name!r} is not imported in the target", hint, ERR_NOT_FOUND)
    if not isinstance(module, types.ModuleType):
        raise CommandError(f"sys.modules[{name!r}] is not a module", "", ERR_USAGE)
    return module


def _static_lookup(owner: Any, name: str) -> tuple[Any, type | None]:
    """The raw attribute (descriptor, not bound) and the class that defines it, if any."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return vars(klass)[name], klass
        raise KeyError(name)
    namespace = getattr(owner, "__dict__", None)
    if isinstance(namespace, dict) and name in namespace:
        return namespace[name], None
    # An instance: look on its class (hooking the function hooks every instance).
    return _static_lookup(type(owner), name)


def _candidates(owner: Any) -> list[str]:
    try:
        return [n for n in dir(owner) if isinstance(n, str)]
    except Exception:
        return []


def _resolve_owner(module: types.ModuleType, dotted: str) -> Any:
    owner: Any = module
    where = module.__name__
    for part in dotted.split("."):
        try:
            owner = _static_lookup(owner, part)[0]
        except KeyError:
            raise _not_found("class", part, where, _classes(owner)) from None
        where = f"{where}.{part}"
    return owner


def _classes(owner: Any) -> list[str]:
    names = []
    for n in _candidates(owner):
        try:
            if isinstance(_static_lookup(owner, n)[0], type):
                names.append(n)
        except Exception:
            continue
    return names or _candidates(owner)


def _unwrap(obj: Any) -> Any:
    """Look through functools.wraps-style decorators to the innermost Python function."""
    seen = 0
    while not isinstance(obj, FunctionType) or hasattr(obj, "__wrapped__"):
        inner = getattr(obj, "__wrapped__", None)
        if inner is None or seen > 32:
            break
        obj, seen = inner, seen + 1
    return obj


def _as_function(raw: Any, where: str, name: str) -> tuple[FunctionType, str]:
    kind = "function"
    if isinstance(raw, classmethod):
        raw, kind = raw.__func__, "classmethod"
    elif isinstance(raw, staticmethod):
        raw, kind = raw.__func__, "staticmethod"
    elif isinstance(raw, property):
        if raw.fget is None:
            raise CommandError(f"property {where}.{name} has no getter", "", ERR_USAGE)
        raw, kind = raw.fget, "property"
    elif isinstance(raw, types.MethodType):  # a bound method stored as an attribute
        raw = raw.__func__
    raw = _unwrap(raw)
    if not isinstance(raw, FunctionType):
        what = type(raw).__name__
        raise CommandError(
            f"{where}.{name} is a {what}, not a Python function; it cannot be hooked",
            "watch/trace hook Python functions and methods; builtins and C extensions "
            "show up inside `trace --c-calls` of a Python caller instead",
            ERR_USAGE,
        )
    return raw, kind


def _unhooked(const: CodeType) -> CodeType:
    """A nested function's own code, looking through a hook already installed on it."""
    if const.co_filename.startswith(HOOK_FILE_PREFIX):
        for inner in const.co_consts:
            if isinstance(inner, CodeType):
                return inner
    return const


def _nested_code(code: CodeType, name: str) -> list[CodeType]:
    """Code objects named ``name`` defined (at any depth) inside ``code``."""
    found: list[CodeType] = []
    for const in code.co_consts:
        if isinstance(const, CodeType):
            const = _unhooked(const)
            if const.co_name == name:
                found.append(const)
            else:
                found.extend(_nested_code(const, name))
    return found


def _nested_names(code: CodeType) -> list[str]:
    names: list[str] = []
    for const in code.co_consts:
        if isinstance(const, CodeType):
            const = _unhooked(const)
            names.append(const.co_name)
            names.extend(_nested_names(const))
    return names


def owner_class(spec: dict[str, Any]) -> type | None:
    """The class a spec's method belongs to (None for a module-level function, or when the
    spec does not resolve: :func:`resolve` says why)."""
    if not spec.get("class"):
        return None
    try:
        owner = _resolve_owner(_find_module(spec.get("module") or ""), str(spec["class"]))
    except CommandError:
        return None
    return owner if isinstance(owner, type) else type(owner)


def method_of(cls: type, name: str) -> Target:
    """The method ``name`` of a class object the agent holds (a model's class found live, which
    may be defined inside a function and so have no importable name). KeyError if it has none."""
    raw, defining = _static_lookup(cls, name)
    where = f"{cls.__module__}.{(defining or cls).__qualname__}"
    function, kind = _as_function(raw, where, name)
    bound_first = kind in ("function", "classmethod", "property")
    if kind == "function":
        kind = "method"
    return Target(f"{where}.{name}", kind, original_code(function), function, bound_first)


def resolve(spec: dict[str, Any]) -> Target:
    """``{"module", "class", "method", "nested"}`` (cli base.target_args) -> :class:`Target`."""
    module_name = spec.get("module") or ""
    class_name = spec.get("class") or None
    method = spec.get("method") or ""
    nested = spec.get("nested") or None
    if not module_name or not method:
        raise CommandError("expected `module [class] method`", "e.g. `__main__ train_step`", ERR_USAGE)
    module = _find_module(module_name)
    owner: Any = module
    where = module_name
    if class_name:
        owner = _resolve_owner(module, class_name)
        where = f"{module_name}.{class_name}"
    try:
        raw, defining = _static_lookup(owner, method)
    except KeyError:
        raise _not_found("method", method, where, _candidates(owner)) from None
    function, kind = _as_function(raw, where, method)
    bound_first = False
    note = ""
    if class_name:
        if kind == "function":
            kind, bound_first = "method", True
        elif kind in ("classmethod", "property"):
            bound_first = True
        if defining is not None and isinstance(owner, type) and defining is not owner:
            note = f"defined in {defining.__module__}.{defining.__qualname__}; hooks it for every subclass"
    description = f"{where}.{method}"
    if not nested:
        return Target(description, kind, original_code(function), function, bound_first, (), note)
    code = original_code(function)
    path = tuple(nested.split("."))
    current = code
    for part in path:
        matches = _nested_code(current, part)
        if not matches:
            raise _not_found(
                "nested function", part, f"{description} ({'.'.join(path[: path.index(part)]) or 'body'})",
                _nested_names(current),
            )
        if len(matches) > 1:
            lines = ", ".join(str(m.co_firstlineno) for m in matches)
            raise CommandError(
                f"{len(matches)} nested functions named {part!r} in {description} (lines {lines})",
                "rename one of them, or name the enclosing one with a dotted -nm outer.inner",
                ERR_USAGE,
            )
        current = matches[0]
    return Target(
        f"{description}.<locals>.{'.'.join(path)}", "nested", current, function,
        bound_first=False, nested_path=path, note=note,
    )
