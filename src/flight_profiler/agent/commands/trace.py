"""``trace``: the call tree below each matching call of one function, with inclusive times.

Args (built by requests/hooks.py)::

    target      {"module", "class", "method", "nested"}
    min_ms      hide subtrees faster than this (default 0.1), summarised with a count
    depth       show this many levels below the traced call (default 0: all, at most
                MAX_TREE_DEPTH)
    count       stop after this many matching calls
    filter      expression over params/kwargs/target/return_obj/throw_exp/cost (as watch)
    timeout     stop after this many seconds
    c_calls     include C functions (builtins, torch ops such as torch._C._nn.linear)

Only the traced thread, for the duration of the traced call, pays: the hook's on_enter sets a
profile function with ``sys.setprofile`` (which affects the calling thread only) and on_exit
removes it. Other threads and other times run untouched. If the filter does not look at
``cost``, ``return_obj`` or ``throw_exp`` it is evaluated on entry, so calls that do not match
are not even profiled.

The tree aggregates by call path: the 50 calls a loop makes to ``f`` are one node ``f ×50`` with
their summed time, in first-call order. Its size is bounded (``MAX_NODES`` distinct paths) so a
long traced call cannot exhaust memory.

On CPython <= 3.11 a call that follows one whose every function was on a single call path is
recorded in C instead (trace_lsprof.py: the same tree, for less).
"""

from __future__ import annotations

import collections
import datetime
import os
import sys
import threading
import time
import types
from typing import Any, Callable

from .. import depth_guard, hooks, shield, trace_lsprof, values
from ..hook_gate import Gate, calls_nothing
from ..hook_registry import HOOK_FILE_PREFIX
from ..protocol import ERR_USAGE
from ..registry import CommandError, Context
from ..targets import resolve
from .watch import QUEUE_MAX, Pump, at_entry, compile_call_function, number_arg

MAX_NODES = 20000
# Levels of the tree shown below the traced call, whatever -d says: the tree is built by
# recursion on the target's thread and sent as nested JSON, so its depth must stay bounded
# even below a function recursing 10,000 deep in a target that raised its recursion limit.
MAX_TREE_DEPTH = 100
# The agent's own callbacks (another hook's on_enter/on_exit met inside the traced call).
_AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_AGENT_FILES = ("<-f>", "<--expr>")
_ModuleType = types.ModuleType
_CAPSULE = type(datetime.datetime_CAPI)  # what pybind11 functions are bound to
_GEN_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen


def make_recorder(
    code: types.CodeType, c_calls: bool
) -> tuple[Callable[..., None], dict[Any, list[Any]], list[int]]:
    """A ``sys.setprofile`` function recording the call-path tree below ``code``.

    Returns (profile function, root children, [node count, done flag, a code met on two call
    paths (or too many paths): the tree is not tree-shaped, see trace_lsprof.py]). A node is a list
    ``[count, total_ns, children, last_code, last_node, what]``, ``what`` its code object
    (Python) or callable (C); children are keyed by ``id(code)`` for Python (a code object's
    hash is recomputed from its constants on every lookup: microseconds for a big function; the
    tree holds the code, so the id stays its own) and by the callable for C. This runs on every
    call and return inside the traced call (several hundred times for a step of 50 small calls),
    hence the closures over locals, and two tricks. Inclusive time: a node subtracts the clock
    when entered and adds it when left (a call path is on the stack at most once, so no start
    time needs storing). The last child: a node remembers the code it called last and that
    child's node, so the loop calling one function over and over (the common shape) finds its
    node by one identity test, with no id() and no dict lookup (bench_watch.py trace-small).
    """
    clock = _clock
    root: dict[Any, list[Any]] = {}
    top: list[Any] = [0, 0, root, None, None, None]  # the traced call's parent (never counted)
    stack: list[list[Any]] = []
    push, pop = stack.append, stack.pop
    info = [0, 0, 0]  # nodes, done, not tree-shaped
    seen: set[Any] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        node: list[Any]
        try:  # nothing of ours may reach the traced code (it would also unset us)
            if event == "call":
                what = frame.f_code
                if stack:
                    parent = stack[-1]
                elif what is code and not info[1]:
                    parent = top
                else:
                    if info[1] and sys.getprofile() is profile:
                        sys.setprofile(None)  # over, but still set (its exit never ran)
                    return
                if parent[3] is what:
                    node = parent[4]
                else:
                    key = id(what)
                    children = parent[2]
                    found = children.get(key)
                    node = found if found is not None else _new_node(children, key, what, info, seen)
                    parent[3] = what
                    parent[4] = node
                node[0] += 1
                node[1] -= clock()
                push(node)
            elif event == "return":
                if stack:
                    node = pop()
                    node[1] += clock()
                    if not stack:  # the traced call returned: stop paying at once (the
                        info[1] = 1  # wrapper's own work after it would be events too)
                        if sys.getprofile() is profile:
                            sys.setprofile(None)
            elif not c_calls or not stack:
                return
            elif event == "c_call":
                owner = getattr(arg, "__self__", None)
                # A method bound per call (list.append, Tensor.sum) is keyed by (type, name)
                # so its calls aggregate (and an unhashable instance is never hashed); module
                # functions and pybind11 functions (bound to a capsule) are stable objects.
                if owner is None or type(owner) is _ModuleType or type(owner) is _CAPSULE:
                    what = arg
                else:
                    what = (type(owner), arg.__name__)
                children = stack[-1][2]
                found = children.get(what)
                node = found if found is not None else _new_node(children, what, what, info, seen)
                node[0] += 1
                node[1] -= clock()
                push(node)
            else:  # c_return, c_exception
                node = pop()
                node[1] += clock()
        except BaseException as exc:
            info[1] = 1
            if sys.getprofile() is profile:
                sys.setprofile(None)
            shield.swallow(exc)

    return profile, root, info


_clock = time.perf_counter_ns
_OVERFLOW_KEY = "<more call paths than the trace keeps>"


def _new_node(
    children: dict[Any, list[Any]], key: Any, what: Any, info: list[int], seen: set[Any]
) -> list[Any]:
    if type(key) is int:  # a Python function (C ones are never recorded by trace_lsprof)
        if key in seen:
            info[2] = 1
        seen.add(key)
    if info[0] >= MAX_NODES:
        info[2] = 1
        key = what = _OVERFLOW_KEY
        node = children.get(key)
        if node is not None:
            return node
    node = children[key] = [0, 0, {}, None, None, what]
    info[0] += 1
    return node


def _describe(key: Any) -> tuple[str, str, int]:
    """(label, file, line) of a node key."""
    if isinstance(key, types.CodeType):
        name = getattr(key, "co_qualname", key.co_name)
        return name, key.co_filename, key.co_firstlineno
    if isinstance(key, tuple):  # (type of the bound instance, method name)
        owner, name = key
        return f"builtin {owner.__module__}.{owner.__qualname__}.{name}", "", 0
    if isinstance(key, str):
        return key, "", 0
    try:
        module = getattr(key, "__module__", None)
        owner = getattr(key, "__self__", None)
        if not module and isinstance(owner, _ModuleType):
            module = owner.__name__
        name = getattr(key, "__qualname__", None) or getattr(key, "__name__", None) or repr(key)
        return f"builtin {module + '.' if module else ''}{name}", "", 0
    except Exception:
        return "builtin <unknown>", "", 0


def build_tree(
    children: dict[Any, list[Any]], min_ns: int, max_depth: int, depth: int = 1
) -> tuple[list[dict[str, Any]], int, int]:
    """Render children to plain data: (shown nodes, hidden call count, hidden ns)."""
    shown: list[dict[str, Any]] = []
    hidden_calls = hidden_ns = 0
    for entry in children.values():
        count, total, sub, key = entry[0], entry[1], entry[2], entry[5]
        if isinstance(key, types.CodeType):
            if key.co_filename.startswith(HOOK_FILE_PREFIX):
                # a hook's wrapper (a watch elsewhere, a recursive call of the traced function):
                # show what it wraps, not the wrapper
                inner, hc, hn = build_tree(sub, min_ns, max_depth, depth)
                shown += inner
                hidden_calls += hc
                hidden_ns += hn
                continue
            if key.co_filename.startswith(_AGENT_DIR) or key.co_filename in _AGENT_FILES:
                continue  # the agent's own callbacks: overhead, not the user's code
        if total < min_ns or (max_depth and depth > max_depth):
            hidden_calls += count
            hidden_ns += total
            continue
        label, filename, line = _describe(key)
        node: dict[str, Any] = {"name": label, "file": filename, "line": line, "count": count, "ms": total / 1e6}
        if len(entry) > 6 and entry[6]:  # trace_lsprof: its callees are summed over its callers
            node["summed_over_callers"] = entry[6]
        kids, hc, hn = build_tree(sub, min_ns, max_depth, depth + 1)
        if kids:
            node["children"] = kids
        if hc:
            node["hidden"] = {"count": hc, "ms": hn / 1e6}
            if max_depth and depth + 1 > max_depth:
                # cut by -d, not by -i: the renderer must not call them "faster"
                node["hidden"]["deeper"] = True
        shown.append(node)
    return shown, hidden_calls, hidden_ns


class _State:
    def __init__(self) -> None:
        self.calls = 0
        self.matched = 0
        self.stopped = False
        self.skipped_profiled = 0  # the thread already had a profiler (e.g. the user's cProfile)
        self.dropped = 0
        self.filter_errors = 0
        self.first_filter_error = ""
        self.lock = threading.Lock()
        # the children of the traced code in the last call recorded exactly, if every function
        # in it was on one call path: the next calls may use trace_lsprof (and its order)
        self.shape: dict[Any, list[Any]] | None = None
        # calls recorded, each sent as the event _event builds of it
        self.queue: collections.deque[tuple[Any, ...]] = collections.deque()

    def filter_failed(self, err: BaseException) -> bool:
        """The filter raised ``err``: the call does not match (True: reject it)."""
        shield.swallow(err)
        self.filter_errors += 1
        if not self.first_filter_error:
            self.first_filter_error = values.render_exception(err)
        return True


def handle_trace(ctx: Context) -> dict[str, Any]:

    target = resolve(ctx.arg("target") or {})
    if target.code.co_flags & _GEN_FLAGS:
        raise CommandError(
            f"{target.description} is a generator or coroutine: trace follows plain calls only",
            "use `watch` on it (one event per generator/coroutine life), or trace the function "
            "that consumes it",
            ERR_USAGE,
        )
    min_ms = number_arg(ctx, "min_ms", 0.1, float)
    asked_depth = number_arg(ctx, "depth", 0)
    max_depth = min(asked_depth or MAX_TREE_DEPTH, MAX_TREE_DEPTH)
    limit = number_arg(ctx, "count", 0)
    timeout = number_arg(ctx, "timeout", 0, float)
    c_calls = bool(ctx.arg("c_calls"))
    # C calls: the Python recorder only (_lsprof would hold the first bound method of each, a
    # tensor's say, until the event is sent, and names them otherwise)
    use_lsprof = trace_lsprof.AVAILABLE and not c_calls
    condition = ctx.arg("filter") or ""
    check = compile_call_function([condition], target, "-f", as_filter=True) if condition else None
    entry_filter = at_entry(condition)
    state = _State()
    min_ns = int(min_ms * 1e6)

    guarded = bool(condition) and not calls_nothing(condition)
    getlimit = sys.getrecursionlimit

    def passes(args: tuple[Any, ...], kwargs: Any, value: Any, exc: Any, elapsed: int) -> bool:
        shift = depth_guard.bounded() if guarded and getlimit() > depth_guard.SAFE_LIMIT else 0
        try:
            return check is None or bool(check(args, kwargs, value, exc, elapsed))
        except BaseException as err:
            return not state.filter_failed(err)
        finally:
            depth_guard.release(shift)

    def on_enter(args: tuple[Any, ...], kwargs: Any) -> Any:
        state.calls += 1
        if state.stopped:
            return hooks.SKIP
        if entry_filter and not passes(args, kwargs, None, None, 0):
            return hooks.SKIP
        return start(args, kwargs)

    def start(args: tuple[Any, ...], kwargs: Any) -> Any:
        """A call past the entry filter: profile it (unless that cannot be done now)."""
        if sys.getprofile() is not None:  # never replace a profiler (ours, nested, or the user's)
            state.skipped_profiled += 1
            return hooks.SKIP
        if len(state.queue) >= QUEUE_MAX:  # the stream cannot keep up: do not even record
            state.dropped += 1
            return hooks.SKIP
        if use_lsprof and state.shape is not None:
            return (args, kwargs, None, None, trace_lsprof.start())
        profile, root, info = make_recorder(target.code, c_calls)
        sys.setprofile(profile)
        return (args, kwargs, root, info, profile)

    def on_exit(token: Any, value: Any, exc: BaseException | None, elapsed: int) -> None:
        args, kwargs, root, info, profile = token
        ours = sys.getprofile() is profile  # the traced code may have set its own: leave that one
        if root is None:  # trace_lsprof's: read on the handler thread
            if ours:
                profile.disable()
            if not _queue(args, kwargs, None, 0, profile, value, exc, elapsed) and not ours:
                trace_lsprof.displaced(profile)
            return
        if ours:
            sys.setprofile(None)
        if use_lsprof:  # every function on one call path: the next calls may be recorded in C
            state.shape = next(iter(root.values()))[2] if info[1] and not info[2] and root else None
        _queue(args, kwargs, root, info[0], None, value, exc, elapsed)

    def _queue(args: tuple[Any, ...], kwargs: Any, root: Any, nodes: int, profiler: Any,
               value: Any, exc: BaseException | None, elapsed: int) -> bool:
        """Queue the call for :func:`_event` if it is to be sent (True)."""
        if state.stopped or (check is not None and not entry_filter and not passes(args, kwargs, value, exc, elapsed)):
            return False
        with state.lock:
            if state.stopped:
                return False
            state.matched += 1
            n = state.matched
            if limit and n >= limit:
                state.stopped = True
            if len(state.queue) >= QUEUE_MAX:
                state.dropped += 1
                return False
        shift = depth_guard.bounded()  # reprs may recurse: bounded
        try:
            # What only this thread may do (render the arguments, name the thread); the tree
            # is built by the handler thread when it sends the event (:func:`_event`): the
            # traced thread pays for recording only, and on 3.12+ runs fewer functions between
            # switching its profiler on and off (each switch re-instruments every function run
            # after it, one of the largest costs of a small traced call).
            state.queue.append((
                n, time.time(), threading.current_thread().name, elapsed,
                values.render(args[1:] if target.bound_first else args, 1),
                values.render_exception(exc) if exc is not None else None, nodes, root, profiler,
            ))
        finally:
            depth_guard.release(shift)
        return True

    def _event(record: tuple[Any, ...]) -> dict[str, Any]:
        """A queued call as the event sent: its tree built here, on the handler thread (the
        recording is over: nothing writes the nodes any more)."""
        n, ts, thread, elapsed, params, exception, nodes, root, profiler = record
        trace_lsprof.release_displaced()
        callers = 0
        if profiler is not None:
            stats = trace_lsprof.release(profiler)
            body, nodes, callers, shaped = trace_lsprof.to_nodes(
                stats, target.code, state.shape, MAX_NODES, MAX_TREE_DEPTH + 1)
            if not shaped:  # the code took another path: back to exact recording
                state.shape = None
        else:
            # the target call itself is the single root; its children are what it called
            roots = list(root.values())
            body = roots[0][2] if roots else {}
        kids, hc, hn = build_tree(body, min_ns, max_depth)
        tree: dict[str, Any] = {
            "name": target.description, "file": target.code.co_filename,
            "line": target.code.co_firstlineno, "count": 1, "ms": elapsed / 1e6,
        }
        if callers > 1:  # it recursed: its callees are summed over the recursive calls too
            tree["summed_over_callers"] = callers
        if kids:
            tree["children"] = kids
        if hc:
            tree["hidden"] = {"count": hc, "ms": hn / 1e6}
        return {
            "type": "trace", "n": n, "ts": ts, "thread": thread, "cost_ms": elapsed / 1e6,
            "params": params, "exception": exception, "nodes": nodes, "tree": tree,
        }

    gate = Gate(state, state.filter_failed, on_exit, entry=condition if entry_filter else "",
                bound_first=target.bound_first, on_pass_enter=start)
    remove = hooks.install(target, on_enter, on_exit, gate=gate)
    ctx.add_hook(f"trace {target.description}", remove)
    started = time.monotonic()
    ctx.emit({
        "type": "tracing", "target": target.description, "min_ms": min_ms,
        "depth": asked_depth,
        "count": limit, "filter": condition, "c_calls": c_calls,
    })
    pump = Pump(ctx, state, started, timeout, build=_event)
    reason = pump.run()
    remove()
    with state.lock:
        state.stopped = True
    pump.finish()
    trace_lsprof.release_displaced()
    return {
        "target": target.description,
        "reason": reason,
        "calls": state.calls,
        "matched": min(state.matched, limit) if limit else state.matched,
        "events": pump.sent,
        "dropped": state.dropped,
        "skipped_already_profiled": state.skipped_profiled,
        "filter_errors": state.filter_errors,
        "first_filter_error": state.first_filter_error,
        "callback_errors": getattr(getattr(remove, "hook", None), "errors", 0),
        "elapsed_s": round(time.monotonic() - started, 3),
    }
