"""Builders of the commands that hook a method: `watch` and `trace`.

Expressions are checked here, before anything is sent: a malformed one never reaches the
target (syntax only: nothing is evaluated on this side).
"""

from __future__ import annotations

from collections.abc import Sequence

from flight_profiler.agent.limits import MAX_EXPRESSIONS, expression_problem
from flight_profiler.errors import UsageError
from flight_profiler.requests.base import AgentRequest, Line, target_args

EXPR_NAMES = "params (or args), kwargs, return_obj, throw_exp, target, cost (ms)"


def check_expression(text: str, option: str) -> None:
    """Reject a malformed expression before attaching."""
    problem = expression_problem(text)  # first: compiling a huge or deep one is the harm
    if problem:
        raise UsageError(f"{option}: {problem}", "shorten or simplify it")
    try:
        compile(text, f"<{option}>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UsageError(
            f"invalid {option} expression {_short(text)}: {getattr(exc, 'msg', None) or exc}",
            f"{option} takes Python expressions over {EXPR_NAMES}",
        ) from None


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def split_exprs(text: str) -> list[str]:
    from flight_profiler.agent.expressions import split_top_level

    return split_top_level(text)


def watch(target: Sequence[str], expr: str | None = None, condition: str | None = None,
          exceptions: bool = False, expand: int | None = None, count: int | None = None,
          timeout: float | None = None, nested: str | None = None) -> AgentRequest:
    """`watch MODULE [CLASS] METHOD`; None leaves an option at the command's default."""
    if expr:
        parts = split_exprs(expr)
        if len(parts) > MAX_EXPRESSIONS:
            raise UsageError(f"--expr: {len(parts)} expressions (limit {MAX_EXPRESSIONS})",
                             "watch fewer expressions at once")
        for part in parts:
            check_expression(part, "--expr")
    if condition:
        check_expression(condition, "-f")
    args = {
        "target": target_args(target, nested), "expr": expr or "", "filter": condition or "",
        "exceptions": exceptions, "expand": 1 if expand is None else expand,
        "count": count or 0, "timeout": timeout or 0,
    }
    line = (Line("watch", *target).option("--expr", expr).option("-f", condition)
            .flag("-e", exceptions).option("-x", expand).option("-n", count)
            .option("--timeout", timeout).option("-nm", nested))
    return AgentRequest("watch", args, str(line))


def trace(target: Sequence[str], min_ms: float | None = None, depth: int | None = None,
          count: int | None = None, condition: str | None = None, timeout: float | None = None,
          c_calls: bool = False, nested: str | None = None) -> AgentRequest:
    """`trace MODULE [CLASS] METHOD`; None leaves an option at the command's default."""
    if condition:
        check_expression(condition, "-f")
    args = {
        "target": target_args(target, nested), "min_ms": 0.1 if min_ms is None else min_ms,
        "depth": depth or 0, "count": 1 if count is None else count, "filter": condition or "",
        "timeout": timeout or 0, "c_calls": c_calls,
    }
    line = (Line("trace", *target).option("-n", count).option("-i", min_ms).option("-d", depth)
            .option("-f", condition).option("--timeout", timeout).flag("--c-calls", c_calls)
            .option("-nm", nested))
    return AgentRequest("trace", args, str(line))
