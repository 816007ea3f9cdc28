"""Bounds on what a client may ask of the agent, checked before any work in the target.

Everything the agent does runs in the target's process, mostly holding its GIL: a 10 MB
expression compiled there froze a target for minutes and grew it by gigabytes. So a request is
refused (usage error) unless its frame, its strings and its expressions are small; the CLI checks
the same bounds before it even attaches. Standard library only (both sides import it).
"""

from __future__ import annotations

from .expressions import nesting, split_top_level

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

MAX_REQUEST_BYTES = 64 * 1024  # one request frame, as received by the agent (strings: 16 KB)
MAX_STRING_CHARS = 16 * 1024  # any string argument
MAX_EXPR_CHARS = 4096  # one expression (--expr part, -f)
MAX_EXPRESSIONS = 64  # --expr parts
MAX_NESTING = 50  # brackets and unary-operator runs: deeper trees blow the compiler's stack
MAX_ARG_ITEMS = 1024  # entries of a list/dict argument, and depth below
_MAX_ARG_DEPTH = 8
EXPRESSION_ARGS = ("expr", "filter")


def expression_problem(text: str) -> str | None:
    """Why ``text`` is too big to compile in the target, or None. Linear in its length."""
    if len(text) > MAX_EXPR_CHARS:
        return f"expression of {len(text)} characters (limit {MAX_EXPR_CHARS})"
    deepest = nesting(text)
    if deepest > MAX_NESTING:
        return f"expression nested {deepest} levels deep (limit {MAX_NESTING})"
    return None


def request_problem(args: Any) -> str | None:
    """Why the arguments of a request are refused, or None."""
    if not isinstance(args, dict):
        return "request arguments must be a JSON object"
    problem = _value_problem(args, 0)
    if problem:
        return problem
    for key in EXPRESSION_ARGS:
        text = args.get(key)
        if isinstance(text, str) and text:
            problem = expression_problem(text) if key == "filter" else _exprs_problem(text)
            if problem:
                return f"{'-f' if key == 'filter' else '--' + key}: {problem}"
    return None


def _exprs_problem(text: str) -> str | None:
    """Bounds of a comma-separated --expr text: each part and their number."""
    parts = split_top_level(text)
    if len(parts) > MAX_EXPRESSIONS:
        return f"{len(parts)} expressions (limit {MAX_EXPRESSIONS})"
    for part in parts:
        problem = expression_problem(part)
        if problem:
            return problem
    return None


def _value_problem(value: Any, depth: int) -> str | None:
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            return f"an argument of {len(value)} characters (limit {MAX_STRING_CHARS})"
        return None
    if isinstance(value, (list, dict)):
        if depth > _MAX_ARG_DEPTH:
            return f"arguments nested deeper than {_MAX_ARG_DEPTH} levels"
        if len(value) > MAX_ARG_ITEMS:
            return f"an argument of {len(value)} items (limit {MAX_ARG_ITEMS})"
        items = value.values() if isinstance(value, dict) else value
        for item in items:
            problem = _value_problem(item, depth + 1)
            if problem:
                return problem
    return None
