"""A hook's call filter in the form the wrapper runs inline: a call it rejects costs the wrapper,
a counter and the condition itself, and not one function call more.

watch and trace hand hooks.install a :class:`Gate` beside their complete callbacks. When the
function carries that one hook, hook_codegen writes the gate's condition into the wrapper's own
code (``params[0] < 0`` becomes ``x < 0`` on the wrapper's parameter ``x``); otherwise (several
hooks, an async generator, a condition that cannot be inlined) the complete callbacks run as
before. Both forms decide the same calls.

What can be inlined: an expression that calls nothing (names, attributes, subscripts,
comparisons, arithmetic, boolean operators, literals), that names none of the function's own
parameters or free variables (in the wrapper those would be the function's, not the module's
globals they are in the callbacks), over ``params``/``args``/``kwargs``/``target`` and, after
the call, ``return_obj``/``throw_exp``/``cost``. An expression that calls something runs in the
callbacks, under the depth guard (depth_guard.py).
"""

from __future__ import annotations

import ast
from typing import Any, Callable

from .hook_registry import CodeType, OnEnter, OnExit

ENTRY, RETURN, RAISE = "entry", "return", "raise"
_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Attribute,
    ast.Subscript, ast.Slice, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict,
    ast.Load,
    ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)


class Gate:
    """The filter of one hook, split from what runs for the calls that pass it.

    ``state`` has ``calls`` (the wrapper adds one per call) and ``stopped`` (once true, calls
    run unobserved). ``fail(exc)`` is called when the condition raises; it returns True (the
    call does not match). ``entry`` is a condition checked before the call, ``exit`` one
    checked after it (it may use the result and the cost); ``raised_only`` passes only calls
    that raised. ``on_pass_enter(args, kwargs)`` (optional) runs for a call past the entry
    condition and returns its token (or hooks.SKIP); without it the token is ``(args,
    kwargs)``. ``on_pass_exit(token, value, exc, elapsed_ns)`` runs for a call past every test.
    ``bound_first``: ``params`` leave out the first argument (self/cls), which ``target`` is.
    """

    __slots__ = ("bound_first", "entry", "exit", "fail", "on_pass_enter", "on_pass_exit",
                 "raised_only", "state")

    def __init__(self, state: Any, fail: Callable[[BaseException], bool], on_pass_exit: OnExit,
                 *, entry: str = "", exit: str = "", raised_only: bool = False,
                 bound_first: bool = False, on_pass_enter: OnEnter | None = None) -> None:
        self.state = state
        self.fail = fail
        self.on_pass_exit = on_pass_exit
        self.entry = entry
        self.exit = exit
        self.raised_only = raised_only
        self.bound_first = bound_first
        self.on_pass_enter = on_pass_enter


def calls_nothing(text: str) -> bool:
    """Is ``text`` an expression of the inlinable kind (it cannot call anything of its own)?"""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return False
    return all(isinstance(node, _ALLOWED) for node in ast.walk(tree))


def _parameters(code: CodeType) -> list[str]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & _CO_VARARGS) + bool(code.co_flags & _CO_VARKEYWORDS)
    return list(code.co_varnames[:count])


class _Rewrite(ast.NodeTransformer):
    def __init__(self, names: dict[str, Callable[[], ast.expr]], positional: list[str]) -> None:
        self.names = names
        self.positional = positional
        self.needs: set[str] = set()

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        # params[2] is the wrapper's own parameter: no tuple to build, no subscript to run
        index = node.slice
        if (isinstance(node.value, ast.Name) and node.value.id in ("params", "args")
                and isinstance(index, ast.Constant) and type(index.value) is int
                and 0 <= index.value < len(self.positional)):
            return ast.copy_location(_name(self.positional[index.value]), node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        make = self.names.get(node.id)
        if make is None:
            return node
        replacement = make()
        if isinstance(replacement, ast.Name):
            self.needs.add(replacement.id)
        return ast.copy_location(replacement, node)


def inline(text: str, code: CodeType, bound_first: bool, where: str) -> tuple[str, frozenset[str]] | None:
    """``text`` as source for the wrapper of ``code`` at ``where`` (ENTRY, RETURN or RAISE),
    with the wrapper locals it needs (``__fp_p__`` params, ``__fp_w__`` kwargs), or None when
    it must run in a callback instead."""
    if not calls_nothing(text):
        return None
    tree = ast.parse(text.strip(), mode="eval")
    params = _parameters(code)
    taken = set(params) | set(code.co_freevars)
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else ""
        if name.startswith("__fp_") or (name in taken and name not in _SPECIAL):
            return None
    positional = params[: code.co_argcount]
    if bound_first:
        if not positional:
            return None
        first, positional = positional[0], positional[1:]
    names: dict[str, Callable[[], ast.expr]] = {
        "params": lambda: _name("__fp_p__"), "args": lambda: _name("__fp_p__"),
        "kwargs": lambda: _name("__fp_w__"),
        "target": (lambda: _name(first)) if bound_first else (lambda: ast.Constant(None)),
    }
    if where != ENTRY:
        names["return_obj"] = (lambda: _name("__fp_r__")) if where == RETURN else (lambda: ast.Constant(None))
        names["throw_exp"] = (lambda: _name("__fp_e__")) if where == RAISE else (lambda: ast.Constant(None))
        names["cost"] = lambda: ast.BinOp(_name("__fp_n__"), ast.Div(), ast.Constant(1e6))
    elif any(isinstance(n, ast.Name) and n.id in _EXIT_ONLY for n in ast.walk(tree)):
        return None
    rewrite = _Rewrite(names, positional)
    body = rewrite.visit(tree)
    ast.fix_missing_locations(body)
    needs = frozenset(n for n in rewrite.needs if n in ("__fp_p__", "__fp_w__"))
    return "(" + ast.unparse(body) + ")", needs


def _name(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


_SPECIAL = frozenset({"params", "args", "kwargs", "target", "return_obj", "throw_exp", "cost"})
_EXIT_ONLY = frozenset({"return_obj", "throw_exp", "cost"})
