"""Who holds each live tensor: the first path from a module global or a running function's local
to it, e.g. ``__main__.trainer.history['loss'][412]``, ``main() local trainer.history[412]``,
``thread 'server' serve() local self.cache['req-7']``.

One breadth-first walk builds a reverse map for all tensors at once (``gc.get_referrers`` per
tensor would be quadratic). Roots, each group walked to the end before the next: the globals
of ``__main__`` and the program's own modules; the locals of the program's running functions
in every thread (and the value a method just returned, when the census runs right after it);
the globals of the libraries; the libraries' running functions' locals. Each root's origin is
kept (global, local with its frame's depth, return value), and the cap of a container whose
length is bounded (a deque's maxlen, an LBFGS history). Walked: dict, list, tuple, set, deque,
instance ``__dict__``, class ``__dict__``,
nn.Module parameters/buffers/submodules, and a tensor's ``.grad``. Not walked: closures,
C++-held references (autograd graphs, C extensions), objects with ``__slots__`` only. Functions
are walked through their closure cells (``make_hook.<closure cache>[*]``).

Each path also has a canonical form where list/tuple indices, dict keys holding digits or
id-like, and every key of a dict above FOLD_KEYS_ABOVE entries become ``[*]``, so that ``losses[411]`` and ``losses[412]`` (and the same holder in a later census)
group together. The walk has an object budget, a depth bound and a deadline; the map keeps
only ids and edge labels, and everything is released when the census returns.
"""

from __future__ import annotations

import collections
import gc
import re
import sys
import sysconfig
import threading
import time
import types
from collections.abc import Iterable
from typing import Any

_ATOMIC = frozenset({int, float, str, bytes, bool, type(None), complex, range, slice})
_SKIP_TYPES = (types.ModuleType, types.BuiltinFunctionType, types.MethodType,
               types.CodeType, types.FrameType, types.TracebackType, types.GeneratorType)
_HEAPTYPE = 1 << 9
_tracked = gc.is_tracked
# The agent's own modules and threads (loaded privately, or in-process as flight_profiler.agent);
# the rest of a flight_profiler package the target may import (e.g. its bundled workloads) is
# user code like any other.
OURS = ("_flight_profiler_agent", "flight_profiler.agent")
_CO_OPTIMIZED = 0x0001
_EMPTY = object()
_DEFAULT_THREAD_NAME = re.compile(r"^(?:Thread|Dummy)-\d+(?: \(.*\))?$")
_IDLIKE = re.compile(r"^(?:\d+|[0-9a-fA-F]{8,}|[0-9a-fA-F-]{32,36}|0x[0-9a-fA-F]+)$")

# Edge kinds: root, attribute, key, index, set member, module parameter/buffer/submodule, grad.
ROOT, ATTR, KEY, INDEX, MEMBER, PARAM, BUFFER, SUBMOD, GRAD, FOLDKEY, CELL = range(11)
# A dict with more keys than this is a cache or a registry: its keys fold into one ``[*]`` so
# that growth shows per container (``_RESULT_CACHE[*]``), not as one new holder per key.
FOLD_KEYS_ABOVE = 16
_MODULE_DICTS = frozenset({"_parameters", "_buffers", "_modules"})
_KIND_NAMES = {ATTR: "attribute", PARAM: "parameter", BUFFER: "buffer", SUBMOD: "attribute",
               GRAD: "grad"}


class Walk:
    """The reverse map: for each tensor id, the edge chain back to a root."""

    def __init__(self) -> None:
        # container id -> (parent container id or -1, edge kind, edge label)
        self.parent: dict[int, tuple[int, int, Any]] = {}
        # tensor id -> (parent container id or -1, edge kind, edge label, holder kind)
        self.found: dict[int, tuple[int, int, Any, str]] = {}
        # root label -> (what the root is: "local" | "return", depth of its frame in its
        # thread, 0 = outermost, -1 for a return value); a label not here is a module global
        self.roots: dict[str, tuple[str, int]] = {}
        # capped container id -> (its limit, its length): a deque's maxlen, an LBFGS history
        self.caps: dict[int, tuple[int, int]] = {}
        self.visited = 0
        self.truncated = ""

    def origin(self, tensor_id: int) -> tuple[str, int, tuple[int, int, int] | None] | None:
        """(what its root is: "global" | "local" | "return", the depth of the root's frame, the
        (id, limit, length) of its nearest capped container within 3 levels), None if unreached."""
        hit = self.found.get(tensor_id)
        if hit is None:
            return None
        pid, _kind, label, _holder = hit
        cap = None
        guard = 0
        while pid != -1 and guard < 256:
            if cap is None and guard < 3 and pid in self.caps:
                cap = (pid, *self.caps[pid])
            entry = self.parent.get(pid)
            if entry is None:
                break
            pid, _kind, label = entry
            guard += 1
        what, depth = self.roots.get(str(label), ("global", -1))
        return what, depth, cap

    def path(self, tensor_id: int) -> tuple[str, str, str] | None:
        """(example path, canonical path, holder kind) of a tensor, or None if unreached."""
        hit = self.found.get(tensor_id)
        if hit is None:
            return None
        pid, kind, label, holder_kind = hit
        edges = [(kind, label)]
        guard = 0
        while pid != -1 and guard < 256:
            entry = self.parent.get(pid)
            if entry is None:
                break
            pid, kind, label = entry
            edges.append((kind, label))
            guard += 1
        edges.reverse()
        example = "".join(_render(k, lab, False) for k, lab in edges)
        canonical = "".join(_render(k, lab, True) for k, lab in edges)
        return example, canonical, holder_kind


def _render(kind: int, label: Any, canonical: bool) -> str:
    if kind == ROOT:
        return str(label)
    if kind in (ATTR, PARAM, BUFFER, SUBMOD, GRAD):
        return f".{label}"
    if kind == INDEX:
        return "[*]" if canonical else f"[{label}]"
    if kind == MEMBER:
        return "{*}"
    if kind == CELL:
        return f".<closure {label}>"
    if kind == FOLDKEY and canonical:
        return "[*]"
    # dict key
    if isinstance(label, str):
        if canonical and (_IDLIKE.match(label) or any(c.isdigit() for c in label)):
            return "[*]"
        return f"[{label[:40]!r}]"
    if isinstance(label, (int, float)) and not isinstance(label, bool):
        return "[*]" if canonical else f"[{label!r}]"
    if label is None or isinstance(label, bool):
        return f"[{label!r}]"
    return "[*]" if canonical else f"[<{type(label).__name__}>]"


def _module_order(modules: Iterable[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(``__main__`` then the program's own modules, everything installed)."""
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    main: list[tuple[str, Any]] = []
    own: list[tuple[str, Any]] = []
    libs: list[tuple[str, Any]] = []
    for name, module in modules:
        if name.startswith(OURS):
            continue  # ourselves
        if name == "__main__":
            main.append((name, module))
            continue
        path = getattr(module, "__file__", None) or ""
        (libs if not path or path.startswith(prefixes) or "site-packages" in path else own).append(
            (name, module)
        )
    return main + own, libs


def frame_prefix(thread: str, module: str, function: str) -> str:
    """``main() local`` in the main thread, ``thread "server" serve() local`` elsewhere."""
    where = f"{function}()" if module == "__main__" else f"{module}.{function}()"
    if thread == "MainThread":
        return f"{where} local"
    if _DEFAULT_THREAD_NAME.match(thread):
        return f"thread {where} local"  # "Thread-7 (run)" is a counter, not a name users chose
    return f"thread {thread!r} {where} local"


def _frame_roots(skip_thread: int | None) -> list[tuple[str, dict[str, Any], bool, int]]:
    """(prefix, locals, in a library, depth from the thread's outermost frame) of every running
    function of every thread but ``skip_thread``, the program's own functions first.

    On CPython < 3.13 ``frame.f_locals`` is a snapshot dict cached on the frame; left there it
    would keep the locals of this moment alive after they are rebound. It is emptied after
    reading (safe: nothing writes it back unless a tracer is active on that frame, checked via
    f_trace, or the function itself calls locals()/vars(), checked via co_names).
    """
    roots: list[tuple[str, dict[str, Any], bool, int]] = []
    snapshot_semantics = sys.version_info < (3, 13)
    # The frames dict holds this very frame (and the census's own, below it): it must not
    # outlive this function, or frame -> local -> dict -> frame would be a cycle keeping every
    # tensor the census collected alive until the next GC pass.
    frames = sys._current_frames()
    if skip_thread is not None:
        frames.pop(skip_thread, None)
    names = {t.ident: t.name for t in threading.enumerate()}
    f: Any = None
    top: Any = None
    chain: list[Any] = []
    lib_prefixes = library_prefixes()
    try:
        # The main thread first: its paths are the ones users recognise.
        for ident, top in sorted(frames.items(), key=lambda kv: names.get(kv[0]) != "MainThread"):
            thread = names.get(ident, f"thread-{ident}")
            if thread.startswith("flight_profiler-"):
                continue  # the agent's own threads
            chain = []
            f = top
            while f is not None:
                chain.append(f)
                f = f.f_back
            # Outermost first, the program's own frames before the libraries' (threading's
            # run(), torch's wrappers): a census taken while the thread is inside step() must
            # name `main() local trainer`, as one taken between steps does, not `step() local
            # self` or `threading.run() local self._args`.
            chain.reverse()
            depth_of = {id(fr): n for n, fr in enumerate(chain)}
            chain.sort(key=lambda fr: fr.f_code.co_filename.startswith(lib_prefixes))
            for f in chain:
                code = f.f_code
                module = str(f.f_globals.get("__name__", "?"))
                if code.co_flags & _CO_OPTIMIZED and not code.co_filename.startswith("<flight_profiler") \
                        and not module.startswith(OURS):
                    prefix = frame_prefix(thread, module, code.co_name)
                    library = code.co_filename.startswith(lib_prefixes)
                    depth = depth_of.get(id(f), -1)
                    if not snapshot_semantics:
                        roots.append((prefix, dict(f.f_locals), library, depth))
                    elif f.f_trace is None and "locals" not in code.co_names and "vars" not in code.co_names:
                        snap = f.f_locals
                        roots.append((prefix, dict(snap), library, depth))
                        snap.clear()
                        snap = None
            chain.clear()
            depth_of.clear()
    finally:
        frames.clear()
        chain.clear()
        f = top = None
    roots.sort(key=lambda root: root[2])  # stable: threads and frame order kept within each
    return roots


def library_prefixes() -> tuple[str, ...]:
    """Where installed code lives: the standard library and site-packages."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            paths.add(sysconfig.get_paths()[key])
        except (KeyError, OSError):
            continue
    return tuple(p for p in paths if p)


def walk(torch: Any, wanted: dict[int, Any], max_objects: int, max_depth: int, deadline: float,
         skip_thread: int | None = None, extra_roots: list[tuple[str, Any]] | None = None) -> Walk:
    """Map each tensor in ``wanted`` (id -> tensor) to the first path that reaches it.

    ``extra_roots``: (label, value) pairs walked after the program's frames, before the
    libraries' (the value a method just returned, when the census runs right after it)."""
    w = Walk()
    tensor_type = torch.Tensor
    module_type = getattr(getattr(torch, "nn", None), "Module", None)
    capped_types = _capped_types(torch)
    parent = w.parent
    found = w.found
    frontier: list[Any] = []  # containers to expand at the next depth
    skip_types_tuple = (*_SKIP_TYPES, tensor_type)
    skip_memo: dict[type, bool] = {}
    cap_memo: dict[type, bool] = {}

    def visit(pid: int, kind: int, label: Any, child: Any, holder_kind: str) -> None:
        cid = id(child)
        if cid in wanted:
            if cid not in found:
                found[cid] = (pid, kind, label, holder_kind)
                parent[cid] = (pid, kind, label)
                if not isinstance(child, tensor_type):  # a module wanted by name (grad_stats)
                    return
                grad = child.grad if child.requires_grad and child.is_leaf else None
                if grad is not None and id(grad) in wanted and id(grad) not in found:
                    found[id(grad)] = (cid, GRAD, "grad", "grad")
            return
        if cid in parent:
            return
        t = type(child)
        skip = skip_memo.get(t)
        if skip is None:
            skip = skip_memo[t] = issubclass(t, skip_types_tuple)
        if skip or not _may_hold(child, t):
            return
        parent[cid] = (pid, kind, label)
        frontier.append(child)
        capped = cap_memo.get(t)
        if capped is None:
            capped = cap_memo[t] = issubclass(t, capped_types)
        if capped:
            _note_caps(child, w.caps)

    wanting = len(wanted)

    def bfs() -> bool:
        nonlocal frontier
        depth = 0
        while frontier and depth < max_depth:
            current, frontier = frontier, []
            depth += 1
            for n, obj in enumerate(current):
                if len(found) >= wanting:  # every one named: nothing left to look for
                    frontier = []
                    return True
                w.visited += 1
                if w.visited > max_objects:
                    w.truncated = f"object budget of {max_objects} containers reached"
                    return False
                if n & 1023 == 0 and time.monotonic() > deadline:
                    w.truncated = "time budget reached while looking for holders"
                    return False
                _expand(obj, id(obj), visit, module_type)
            del current
        if frontier:
            w.truncated = f"depth bound of {max_depth} reached"
            frontier = []
        return True

    # The program's module globals first, walked to the end: their paths are stable from one
    # census to the next. Then the program's running functions' locals, for what no global of
    # its own reaches; only then the libraries' globals and functions: a census cut short by its
    # budget (a loaded machine, a huge heap) has named what the program holds, and a tensor
    # that a library also reaches is named by the program's own variable.
    program, libraries = _module_order(list(sys.modules.items()))

    def globals_of(modules: list[tuple[str, Any]]) -> None:
        for name, module in modules:
            try:
                items = list(vars(module).items())
            except Exception:
                continue
            for key, value in items:
                if type(value) not in _ATOMIC and not key.startswith("__"):
                    visit(-1, ROOT, f"{name}.{key}", value, "global")

    # The program's running functions are walked to the end before any library function's:
    # while the main thread is inside optimizer.step(), sgd()'s local `param` reaches a weight in
    # one edge and would otherwise beat `main() local trainer.model.0.weight` (three edges), and
    # a tensor's name would depend on the moment it was looked at.
    roots = _frame_roots(skip_thread)
    try:
        globals_of(program)
        if not bfs():
            return w
        for library in (False, True):
            if library:
                if len(found) >= wanting:
                    # The program's own roots named every one: the libraries' globals (torch's
                    # ~1,000 modules, most of a census's walk) could only name them later.
                    return w
                globals_of(libraries)
                if not bfs():
                    break
            for prefix, local_vars, in_library, depth in roots:
                if in_library is library:
                    for key, value in local_vars.items():
                        if type(value) not in _ATOMIC:
                            w.roots.setdefault(f"{prefix} {key}", ("local", depth))
                            visit(-1, ROOT, f"{prefix} {key}", value, "local")
                    local_vars.clear()
            if not library:
                for label, value in extra_roots or ():
                    w.roots.setdefault(label, ("return", -1))
                    visit(-1, ROOT, label, value, "return")
            if not bfs():
                break
    finally:
        for root in roots:
            root[1].clear()
        roots.clear()
    return w


def _capped_types(torch: Any) -> tuple[type, ...]:
    """Containers whose length has a known limit: a deque with maxlen, LBFGS's history."""
    lbfgs = getattr(getattr(torch, "optim", None), "LBFGS", None)
    return (collections.deque, lbfgs) if isinstance(lbfgs, type) else (collections.deque,)


def _note_caps(obj: Any, caps: dict[int, tuple[int, int]]) -> None:
    """Record the limit of a capped container: a deque's maxlen; LBFGS keeps at most
    ``history_size`` entries in each of old_dirs / old_stps / ro (al is preallocated at it)."""
    try:
        if isinstance(obj, collections.deque):
            if obj.maxlen is not None:
                caps[id(obj)] = (int(obj.maxlen), len(obj))
            return
        groups = object.__getattribute__(obj, "param_groups")
        size = int(groups[0].get("history_size", 100)) if groups else 100
        state = object.__getattribute__(obj, "state")
        for per_param in list(state.values()):
            if isinstance(per_param, dict):
                for key in ("old_dirs", "old_stps", "ro", "al"):
                    held = per_param.get(key)
                    if type(held) is list:
                        caps[id(held)] = (size, len(held))
    except Exception:  # an odd or half-built object: no cap known
        return


def _may_hold(obj: Any, t: type) -> bool:
    """Could ``obj`` lead to a tensor? Only containers with a non-atomic member get a place in
    the reverse map: the walk's memory is then proportional to the inner nodes of the object
    graph, not to every list of numbers (1 M such objects would cost ~200 MB of map)."""
    try:
        if t is dict or t is tuple:
            if not gc.is_tracked(obj):  # CPython untracks dicts/tuples of atomic values
                return False
            values: Iterable[Any] = obj.values() if t is dict else obj
        elif t is list or t is set or t is frozenset or t is collections.deque:
            values = obj
        elif issubclass(t, dict):
            values = obj.values()
        elif issubclass(t, (list, tuple)):
            values = obj
        elif issubclass(t, type):
            return bool(obj.__flags__ & _HEAPTYPE)
        elif t is types.FunctionType:
            cells = obj.__closure__
            if not cells:
                return False
            values = [c.cell_contents for c in cells if _full(c)]
        elif t.__flags__ & _HEAPTYPE or t is types.SimpleNamespace:
            d = object.__getattribute__(obj, "__dict__")
            if not isinstance(d, dict):
                return False
            values = d.values()
        else:
            return False
        return any(type(v) not in _ATOMIC for v in values)
    except Exception:  # no __dict__, or mutated while we looked
        return False


def _full(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _EMPTY
    except ValueError:  # a cell not yet (or no longer) bound
        return False


def _expand(obj: Any, cid: int, visit: Any, module_type: Any) -> None:
    t = type(obj)
    try:
        # The loops below are the hot path (one iteration per member of every container):
        # untracked dicts/tuples (atomic contents only) are dropped here, without a call.
        if t is list or t is tuple or t is collections.deque:
            kind = t.__name__
            for i, v in enumerate(list(obj)):
                tv = type(v)
                if tv not in _ATOMIC and not ((tv is dict or tv is tuple) and not _tracked(v)):
                    visit(cid, INDEX, i, v, kind)
        elif issubclass(t, dict):
            items = list(obj.items())
            edge = FOLDKEY if len(items) > FOLD_KEYS_ABOVE else KEY
            for k, v in items:
                tv = type(v)
                if tv not in _ATOMIC and not ((tv is dict or tv is tuple) and not _tracked(v)):
                    visit(cid, edge, k, v, "dict")
        elif t is set or t is frozenset:
            for v in list(obj):
                if type(v) not in _ATOMIC:
                    visit(cid, MEMBER, None, v, "set")
        elif issubclass(t, type):
            if obj.__flags__ & _HEAPTYPE:
                for k, v in list(obj.__dict__.items()):
                    if type(v) not in _ATOMIC and not k.startswith("__"):
                        visit(cid, ATTR, k, v, "class attribute")
        elif issubclass(t, (list, tuple)):
            for i, v in enumerate(list(obj)):
                if type(v) not in _ATOMIC:
                    visit(cid, INDEX, i, v, type(obj).__name__)
        elif t is types.FunctionType:
            cells = obj.__closure__
            if cells:
                for name, cell in zip(obj.__code__.co_freevars, cells):
                    try:
                        v = cell.cell_contents
                    except ValueError:  # an empty cell
                        continue
                    if type(v) not in _ATOMIC and type(v) is not types.ModuleType:
                        visit(cid, CELL, name, v, "closure")
        elif t.__flags__ & _HEAPTYPE or t is types.SimpleNamespace:
            try:
                d = object.__getattribute__(obj, "__dict__")
            except Exception:
                return
            if not isinstance(d, dict):
                return
            skip: frozenset[str] = frozenset()
            if module_type is not None and issubclass(t, module_type):
                skip = _MODULE_DICTS
                for attr, edge in (("_parameters", PARAM), ("_buffers", BUFFER), ("_modules", SUBMOD)):
                    sub = d.get(attr)
                    if isinstance(sub, dict):
                        for k, v in list(sub.items()):
                            if v is not None:
                                visit(cid, edge, k, v, _KIND_NAMES[edge])
            for k, v in list(d.items()):
                if type(v) not in _ATOMIC and not (isinstance(k, str) and k.startswith("__")) \
                        and k not in skip:
                    visit(cid, ATTR, k, v, "attribute")
    except RuntimeError:  # mutated by another thread while we copied it: skip this container
        return
