"""``watch``: arguments, return value, exception and cost of each call of one function.

Args (built by requests/hooks.py)::

    target      {"module", "class", "method", "nested"}
    expr        comma list of expressions (default: params, return_obj, cost; throw_exp when raised)
    filter      expression deciding which calls to report (sees cost too)
    exceptions  only calls that raised
    expand      depth to which containers/objects are expanded (default 1)
    count       stop after this many MATCHING calls
    timeout     stop after this many seconds

Names an expression sees: ``params`` (alias ``args``: positional arguments without
``self``/``cls``), ``kwargs``, ``return_obj``, ``throw_exp``, ``target`` (``self``/``cls``, or
None for plain functions), ``cost`` (ms), plus the globals of the function's module.

How it stays cheap: the filter and expressions are compiled once into one small function each;
a call that does not match costs the hook plus that function. Values are rendered to text in the
calling thread right away (values.py) and only the text is queued: no reference to a target
object outlives the call. The queue between the target's threads and this handler is bounded:
when it is full (a flood) further calls are counted as dropped, not rendered, and the count is
reported in the stream and the result.
"""

from __future__ import annotations

import collections
import itertools
import sys
import threading
import time
import types
from typing import Any, Callable, Protocol

from .. import depth_guard, hooks, shield, values
from ..expressions import split_top_level
from ..hook_gate import Gate, calls_nothing
from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..targets import Target, resolve

NAMES = ("params", "args", "kwargs", "return_obj", "throw_exp", "target", "cost")
_ARGS, _COST, _RETURN = "args", "cost", "return"
_KINDS = {"params": _ARGS, "args": _ARGS, "cost": _COST, "return_obj": _RETURN}
DEFAULT_EXPRS = ("params", "return_obj", "cost")
QUEUE_MAX = 256  # events waiting to be sent; beyond it calls are counted as dropped
POLL_S = 0.05


def number_arg(ctx: Context, name: str, default: float, kind: type = int) -> Any:
    """A non-negative number argument; a bad one is a usage error, not an internal one."""
    raw = ctx.arg(name)
    if raw is None or raw == "":
        return kind(default)
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise CommandError(f"{name} must be a number, got {raw!r}", "", ERR_USAGE) from None
    if value < 0:
        raise CommandError(f"{name} must not be negative, got {raw!r}", "", ERR_USAGE)
    return value


class ExprError:
    """Stands for the value of an expression that raised (shown, never fatal): SystemExit,
    KeyboardInterrupt and GeneratorExit included (shield.py)."""

    __slots__ = ("text",)

    def __init__(self, exc: BaseException) -> None:
        shield.swallow(exc)
        self.text = f"<error: {values.render_exception(exc)}>"


def check_syntax(text: str, what: str) -> types.CodeType:
    try:
        return compile(text, f"<{what}>", "eval")
    except SyntaxError as exc:
        raise CommandError(
            f"invalid {what} {text!r}: {exc.msg}",
            f"{what} takes Python expressions over {', '.join(NAMES)}",
            ERR_USAGE,
        ) from None


def _prelude(used: set[str], target: Target) -> list[str]:
    """Lines binding the expression names an expression uses (and only those)."""
    lines = []
    if "target" in used:
        lines.append("    target = __fp_a__[0] if __fp_a__ else None" if target.bound_first else "    target = None")
    if used & {"params", "args"}:
        lines.append("    params = args = __fp_a__[1:]" if target.bound_first else "    params = args = __fp_a__")
    if "cost" in used:
        lines.append("    cost = __fp_ns__ / 1e6")
    return lines


def _build(source: list[str], target: Target, what: str, defaults: tuple[Any, ...]) -> Callable[..., Any]:
    module = compile("\n".join(source) + "\n", f"<{what}>", "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    # Built by hand so nothing is added to the user's module namespace; expressions see its
    # globals (e.g. `torch`, the user's helpers).
    return types.FunctionType(code, target.function.__globals__, code.co_name, defaults)


def compile_call_function(
    exprs: list[str], target: Target, what: str, as_filter: bool = False
) -> Callable[..., Any]:
    """One function ``(args, kwargs, return_obj, throw_exp, elapsed_ns) -> values``.

    For a filter it returns the expression's value (exceptions propagate to the caller, which
    counts them); otherwise a tuple with one entry per expression, an :class:`ExprError` for
    each that raised. Compiled once.
    """
    used: set[str] = set()
    for text in exprs:
        used.update(check_syntax(text, what).co_names)
    lines = ["def __fp_eval__(__fp_a__, kwargs, return_obj, throw_exp, __fp_ns__, __fp_err__=None):"]
    lines += _prelude(used, target)
    if as_filter:
        lines.append(f"    return ({exprs[0]}\n)")
    else:
        for i, text in enumerate(exprs):
            lines += [
                "    try:",
                f"        __fp_v{i}__ = ({text}\n)",
                "    except BaseException as __fp_e__:",
                f"        __fp_v{i}__ = __fp_err__(__fp_e__)",
            ]
        lines.append("    return (" + "".join(f"__fp_v{i}__, " for i in range(len(exprs))) + ")")
    return _build(lines, target, what, (ExprError,))


def compile_render(exprs: list[str], expand: int, default_view: bool, target: Target) -> Callable[..., Any]:
    """One function ``(n, args, kwargs, return_obj, throw_exp, elapsed_ns) -> event``: every
    expression evaluated and rendered to text, in straight-line code (it runs on the target's
    thread for every reported call). An expression that raises shows as its error."""
    used: set[str] = set()
    for text in exprs:
        used.update(check_syntax(text, "--expr").co_names)
    lines = [
        "def __fp_render__(__fp_n__, __fp_a__, kwargs, return_obj, throw_exp, __fp_ns__, "
        "__fp_err__=None, __fp_R__=None, __fp_F__=None, __fp_E__=None, __fp_T__=None, "
        "__fp_C__=None):",
        *_prelude(used, target),
        "    __fp_s__ = []",
    ]
    for text in exprs:
        kind = _KINDS.get(text)
        depth = expand + 1 if text in ("params", "args", "kwargs") else expand
        if kind is _ARGS:
            shown = [
                "if type(__fp_v__) is tuple:",
                f"    __fp_t__ = ', '.join([__fp_R__(__fp_x__, {depth - 1}) for __fp_x__ in __fp_v__])",
                "    __fp_t__ = '(' + __fp_t__ + (',)' if len(__fp_v__) == 1 else ')')",
                "else:",
                f"    __fp_t__ = __fp_R__(__fp_v__, {depth})",
            ]
        elif kind is _COST:
            shown = [f"__fp_t__ = __fp_F__(__fp_v__) if type(__fp_v__) is float else __fp_R__(__fp_v__, {depth})"]
        else:
            shown = [f"__fp_t__ = __fp_R__(__fp_v__, {depth})"]
        body = [
            "try:",
            f"    __fp_v__ = ({text}\n)",
            "except BaseException as __fp_e__:",
            "    __fp_t__ = __fp_err__(__fp_e__).text",
            "else:",
            *("    " + ln for ln in shown),
            f"__fp_s__.append([{text!r}, __fp_t__])",
        ]
        if kind is _RETURN and default_view:  # a call that raised has no return value to show
            body = ["if throw_exp is None:", *("    " + ln for ln in body)]
        lines += ["    " + ln for ln in body]
    lines += [
        "    return {'type': 'call', 'n': __fp_n__, 'ts': __fp_T__(), 'thread': __fp_C__().name,",
        "            'cost_ms': __fp_ns__ / 1e6, 'values': __fp_s__,",
        "            'exception': None if throw_exp is None else __fp_E__(throw_exp)}",
    ]
    defaults = (ExprError, values.render, values.fmt_ms, values.render_exception, time.time,
                threading.current_thread)
    return _build(lines, target, "--expr", defaults)


EXIT_ONLY_NAMES = frozenset({"cost", "return_obj", "throw_exp"})


def at_entry(condition: str) -> bool:
    """Can this filter decide before the call runs (it looks at no result and no cost)?"""
    return bool(condition) and not EXIT_ONLY_NAMES & set(check_syntax(condition, "-f").co_names)


def _filter_lines(condition: str, target: Target, reject: str) -> list[str]:
    # A filter that calls something may recurse: bounded (depth_guard.py); one that calls
    # nothing costs no more than itself.
    guarded = not calls_nothing(condition)
    return [
        *_prelude(set(check_syntax(condition, "-f").co_names), target),
        *(["    __fp_d__ = __fp_bounded__() if __fp_limit__() > __fp_safe__ else 0"] if guarded else []),
        "    try:",
        f"        if not ({condition}\n):",
        f"            return {reject}",
        "    except BaseException as __fp_e__:",
        "        __fp_s__.filter_failed(__fp_e__)",
        f"        return {reject}",
        *(["    finally:", "        if __fp_d__:", "            __fp_release__(__fp_d__)"]
          if guarded else []),
    ]


def compile_gate(
    condition: str, only_exceptions: bool, target: Target, state: _State
) -> tuple[Callable[..., Any] | None, Callable[..., None]]:
    """The hook's (on_enter, on_exit): count, filter (inlined: no extra call), hand matches on.

    A filter on arguments only runs on entry and answers hooks.SKIP for the calls it rejects:
    those then run untimed, paying only for this one function. Any other filter runs on exit.
    """
    stop = "    if __fp_s__.stopped" + (" or throw_exp is None" if only_exceptions else "") + ":"
    guard = "__fp_bounded__=None, __fp_release__=None, __fp_limit__=None, __fp_safe__=None"
    exit_lines = [
        f"def __fp_gate__(__fp_t__, return_obj, throw_exp, __fp_ns__, __fp_s__=None, {guard}):",
        *([] if at_entry(condition) else ["    __fp_s__.calls += 1"]),
        stop,
        "        return",
        "    __fp_a__, kwargs = __fp_t__",
    ]
    if condition and not at_entry(condition):
        exit_lines += _filter_lines(condition, target, "")
    exit_lines.append("    __fp_s__.matched(__fp_a__, kwargs, return_obj, throw_exp, __fp_ns__)")
    guards = (depth_guard.bounded, depth_guard.release, sys.getrecursionlimit, depth_guard.SAFE_LIMIT)
    on_exit = _build(exit_lines, target, "-f", (state, *guards))
    if not at_entry(condition):
        return None, on_exit
    enter_lines = [
        f"def __fp_gate_enter__(__fp_a__, kwargs, __fp_s__=None, __fp_skip__=None, {guard}):",
        "    __fp_s__.calls += 1",
        "    if __fp_s__.stopped:",
        "        return __fp_skip__",
        *_filter_lines(condition, target, "__fp_skip__"),
        "    return (__fp_a__, kwargs)",
    ]
    return _build(enter_lines, target, "-f", (state, hooks.SKIP, *guards)), on_exit


def make_gate(condition: str, only_exceptions: bool, target: Target, state: _State) -> Gate:
    """The same filter as :func:`compile_gate`'s, for the wrapper to run inline (hook_gate.py)."""
    entry = at_entry(condition)
    return Gate(state, state.filter_failed, state.passed,
                entry=condition if entry else "", exit="" if entry else condition,
                raised_only=only_exceptions, bound_first=target.bound_first)


class _State:
    """Shared between the target's threads (producers) and the handler (consumer)."""

    # slots: the gate reads and writes these on every call of the watched function
    __slots__ = ("busy", "calls", "counter", "dropped", "filter_errors", "first_filter_error",
                 "last_matched", "limit", "queue", "render", "stopped")

    def __init__(self, limit: int, render: Callable[..., dict[str, Any]]) -> None:
        self.limit = limit
        self.render = render
        self.calls = 0  # every call seen (approximate under thread races: informational)
        self.counter = itertools.count(1)  # next() is atomic under the GIL
        self.last_matched = 0
        self.dropped = 0
        self.filter_errors = 0
        self.first_filter_error = ""
        self.stopped = False
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.busy = threading.local()  # set while rendering: ignore re-entrant calls

    def filter_failed(self, err: BaseException) -> bool:
        """The filter raised ``err``: the call does not match (True: reject it)."""
        shield.swallow(err)
        self.filter_errors += 1
        if not self.first_filter_error:
            self.first_filter_error = values.render_exception(err)
        return True

    def matched(self, args: tuple[Any, ...], kwargs: Any, value: Any, exc: Any, elapsed: int) -> None:
        self.passed((args, kwargs), value, exc, elapsed)

    def passed(self, token: tuple[Any, Any], value: Any, exc: Any, elapsed: int) -> None:
        """A call past the filter (its token is the arguments): render and queue it."""
        n = next(self.counter)
        limit = self.limit
        if limit and n > limit:
            return
        self.last_matched = n
        busy = self.busy
        if len(self.queue) >= QUEUE_MAX:
            self.dropped += 1
        elif not getattr(busy, "on", False):  # a repr that calls the watched function
            busy.on = True
            # expressions and reprs may recurse: bounded (nothing to do at a usual limit)
            shift = _bounded() if _getlimit() > _SAFE_LIMIT else 0
            try:
                self.queue.append(self.render(n, token[0], token[1], value, exc, elapsed))
            finally:
                if shift:
                    depth_guard.release(shift)
                busy.on = False
        if n == limit:  # after the append, so the handler's last flush sends it
            self.stopped = True


_bounded, _getlimit, _SAFE_LIMIT = depth_guard.bounded, sys.getrecursionlimit, depth_guard.SAFE_LIMIT


class PumpState(Protocol):
    """What a :class:`Pump` reads and writes of a command's state (watch's and trace's)."""

    queue: collections.deque[Any]
    dropped: int
    stopped: bool
    first_filter_error: str


class Pump:
    """Moves rendered events from the bounded queue to the client until the command ends.

    ``state`` needs ``queue`` (a deque), ``dropped``, ``stopped`` and ``first_filter_error``.
    Sending never outlives the command's deadline: a client that reads slowly gets fewer events
    (counted as dropped), never a watch that overstays its --timeout.
    """

    FINAL_S = 1.0  # after the hook is gone, at most this long to send what was queued

    def __init__(self, ctx: Context, state: PumpState, started: float, timeout: float,
                 build: Callable[[Any], dict[str, Any]] | None = None) -> None:
        """``build`` makes the event of a queued item (trace queues records and builds their
        trees here, on the handler thread); without it the items are the events."""
        self.ctx = ctx
        self.build = build
        self.state = state
        self.deadline = started + timeout if timeout else None
        self.sent = 0
        self.reported_drops = 0
        self.reported_error = False

    def report_drops(self) -> None:
        dropped = self.state.dropped
        if dropped > self.reported_drops:
            self.ctx.emit({"type": "dropped", "count": dropped - self.reported_drops, "total": dropped})
            self.reported_drops = dropped

    def flush(self, until: float | None) -> None:
        state, ctx = self.state, self.ctx
        while state.queue and not ctx.cancelled:
            if until is not None and time.monotonic() >= until:
                break
            self.report_drops()  # as they happen, not after a long backlog
            event = state.queue.popleft()
            if self.build is not None:
                try:
                    event = self.build(event)
                except Exception as exc:  # never the pump's end: that one is lost, counted
                    shield.swallow(exc)
                    state.dropped += 1
                    continue
            if not ctx.emit(event):
                state.dropped += 1  # the client went away with this one in hand
                return
            self.sent += 1
        self.report_drops()
        if state.first_filter_error and not self.reported_error:
            self.reported_error = True
            ctx.emit({"type": "filter_error", "message": state.first_filter_error})

    def run(self) -> str:
        """Until cancel, -n or --timeout; returns which."""
        while True:
            if self.ctx.wait(POLL_S):
                return "cancelled"
            self.flush(self.deadline)
            if self.state.stopped:
                return "count"
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return "timeout"

    def finish(self) -> None:
        """After the hook is removed: send the rest briefly, count what is left as dropped."""
        if not self.ctx.cancelled:
            self.flush(time.monotonic() + self.FINAL_S)
        self.state.dropped += len(self.state.queue)
        self.state.queue.clear()


def handle_watch(ctx: Context) -> dict[str, Any]:
    target = resolve(ctx.arg("target") or {})
    expr_text = ctx.arg("expr") or ""
    exprs = split_top_level(expr_text) if expr_text else list(DEFAULT_EXPRS)
    condition = ctx.arg("filter") or ""
    only_exceptions = bool(ctx.arg("exceptions"))
    expand = number_arg(ctx, "expand", 1)
    limit = number_arg(ctx, "count", 0)
    timeout = number_arg(ctx, "timeout", 0, float)

    render = compile_render(exprs, expand, not expr_text, target)

    state = _State(limit, render)
    on_enter, on_exit = compile_gate(condition, only_exceptions, target, state)
    gate = make_gate(condition, only_exceptions, target, state)
    remove = hooks.install(target, on_enter, on_exit, gate=gate)
    ctx.add_hook(f"watch {target.description}", remove)
    started = time.monotonic()
    ctx.emit({
        "type": "watching", "target": target.description, "kind": target.kind, "note": target.note,
        "exprs": exprs, "filter": condition, "count": limit, "timeout": timeout,
    })
    pump = Pump(ctx, state, started, timeout)
    reason = pump.run()
    remove()  # stop paying at once; registry.run would also do it at the end
    state.stopped = True
    pump.finish()
    return {
        "target": target.description,
        "reason": reason,
        "calls": state.calls,
        "matched": state.last_matched if not limit else min(state.last_matched, limit),
        "events": pump.sent,
        "dropped": state.dropped,
        "filter_errors": state.filter_errors,
        "first_filter_error": state.first_filter_error,
        "callback_errors": getattr(getattr(remove, "hook", None), "errors", 0),
        "elapsed_s": round(time.monotonic() - started, 3),
    }
