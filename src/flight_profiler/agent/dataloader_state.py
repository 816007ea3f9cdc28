"""The DataLoaders alive in the target, their real settings and workers, and where the threads
that iterate them spend their time.

Used by ``torch dataloader`` and by diagnose (its input-bound fix quotes these settings). Reads
only plain Python attributes of torch.utils.data objects (never a tensor), so it needs no safe
point; each worker is read from /proc (state, RSS, CPU time), never through
``multiprocessing`` (``Process.is_alive`` would reap a dead worker behind the loader's back).
Nothing is kept: the result is plain data.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

from .thread_gate import AGENT_THREAD_PREFIX, blocked_in

_LOADER_FILE = os.sep + os.path.join("torch", "utils", "data", "dataloader.py")
_TORCH_DIR = os.sep + "torch" + os.sep
_LOADER_WAITS = frozenset({"_get_data", "_try_get_data"})
_LOADER_CALLS = frozenset({"__next__", "_next_data"})
# Inside the loader's wait: blocked until a worker sends a batch (the queue's poll), or
# receiving one that is ready: the pipe read, the unpickling, and for every tensor a
# round trip to the worker for its shared memory (torch's file_descriptor strategy).
_RECEIVING = frozenset({"_recv_bytes", "_recv", "recv_bytes", "loads", "recv_handle", "recvfds"})
_SHARING_FILES = (os.sep + os.path.join("multiprocessing", "reductions.py"),
                  os.sep + os.path.join("multiprocessing", "resource_sharer.py"),
                  os.sep + os.path.join("multiprocessing", "reduction.py"))
_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    try:
        return object.__getattribute__(obj, name)
    except Exception:
        return default


def _plain(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)[:80]


def _dataset(ds: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": f"{type(ds).__module__}.{type(ds).__qualname__}", "length": None}
    with contextlib.suppress(Exception):  # an IterableDataset, or a __len__ that fails
        out["length"] = len(ds)
    return out


def _proc(pid: int) -> dict[str, Any]:
    """State, RSS and CPU seconds of a worker process, from /proc."""
    info: dict[str, Any] = {"pid": pid, "state": "gone", "rss_bytes": None, "cpu_s": None}
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        info["state"] = {"R": "running", "S": "sleeping", "D": "disk wait", "Z": "zombie",
                         "T": "stopped"}.get(fields[0], fields[0])
        info["cpu_s"] = (int(fields[11]) + int(fields[12])) / _CLK
        with open(f"/proc/{pid}/statm") as f:
            info["rss_bytes"] = int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        pass
    return info


def _iterator(it: Any) -> dict[str, Any]:
    sampler = _attr(it, "_index_sampler")
    task_info = _attr(it, "_task_info") or {}
    workers = _attr(it, "_workers") or []
    status = _attr(it, "_workers_status") or []
    rows = []
    for i, w in enumerate(list(workers)):
        pid = _attr(w, "_popen")
        pid = _attr(pid, "pid") if pid is not None else None
        row: dict[str, Any] = _proc(int(pid)) if isinstance(pid, int) else {"pid": None, "state": "not started"}
        row["worker_id"] = i
        row["active"] = bool(status[i]) if i < len(status) else None
        rows.append(row)
    try:
        ready = sum(1 for v in list(task_info.values()) if isinstance(v, tuple) and len(v) == 2)
    except Exception:
        ready = None
    pin = _attr(it, "_pin_memory_thread")
    return {
        "type": type(it).__name__,
        "dataset": _dataset(_attr(it, "_dataset")),
        "batch_size": _plain(_attr(sampler, "batch_size")),
        "drop_last": _plain(_attr(it, "_drop_last")),
        "num_workers": _plain(_attr(it, "_num_workers", 0)),
        "pin_memory": _plain(_attr(it, "_pin_memory", False)),
        "prefetch_factor": _plain(_attr(it, "_prefetch_factor")),
        "persistent_workers": _plain(_attr(it, "_persistent_workers", False)),
        "timeout": _plain(_attr(it, "_timeout", 0)),
        "batches_yielded": _plain(_attr(it, "_num_yielded")),
        "epoch_batches": epoch_batches(it),
        "batches_in_flight": _plain(_attr(it, "_tasks_outstanding")),
        "batches_ready": ready,
        "pin_memory_thread": None if pin is None else bool(pin.is_alive()),
        "workers": rows,
        **({"distributed_shuffle": True} if _shuffles_per_epoch(sampler) else {}),
    }


def _shuffles_per_epoch(index_sampler: Any) -> bool:
    sampler = _attr(index_sampler, "sampler", index_sampler)  # inside a BatchSampler, or itself
    return distributed_sampler(sampler) and _attr(sampler, "shuffle") is True


def distributed_sampler(sampler: Any) -> bool:
    """A torch DistributedSampler (or a subclass): its order changes per epoch only through
    ``set_epoch``."""
    module = sys.modules.get("torch.utils.data.distributed")
    kind = getattr(module, "DistributedSampler", None) if module is not None else None
    return isinstance(kind, type) and isinstance(sampler, kind)


def _sampler(sampler: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": f"{type(sampler).__module__}.{type(sampler).__qualname__}"}
    if distributed_sampler(sampler):
        out.update({"distributed": True, "shuffle": _plain(_attr(sampler, "shuffle")),
                    "epoch": _plain(_attr(sampler, "epoch")),
                    "num_replicas": _plain(_attr(sampler, "num_replicas")),
                    "rank": _plain(_attr(sampler, "rank"))})
    return out


def _loader(dl: Any) -> dict[str, Any]:
    return {
        "type": type(dl).__name__,
        "sampler": _sampler(_attr(dl, "sampler")),
        "dataset": _dataset(_attr(dl, "dataset")),
        "batch_size": _plain(_attr(dl, "batch_size")),
        "drop_last": _plain(_attr(dl, "drop_last")),
        "num_workers": _plain(_attr(dl, "num_workers", 0)),
        "pin_memory": _plain(_attr(dl, "pin_memory", False)),
        "prefetch_factor": _plain(_attr(dl, "prefetch_factor")),
        "persistent_workers": _plain(_attr(dl, "persistent_workers", False)),
        "iterators": [],
    }


def find_loaders(track: list[tuple[dict[str, Any], Any]] | None = None,
                 samplers: dict[int, tuple[dict[str, Any], int]] | None = None) -> list[dict[str, Any]]:
    """Each live DataLoader with its live iterators (matched by dataset); orphan iterators too.

    ``track`` receives (iterator doc, weak reference to the iterator), for a caller that reads
    the counters again later without keeping an epoch's iterator (and its workers) alive.
    ``samplers`` receives, per shuffling DistributedSampler's id, (its loader's row, the id of
    the loader's dataset), for a caller that follows their epochs (NextTimer.sampler_epochs).
    """
    module = sys.modules.get("torch.utils.data.dataloader")
    if module is None:
        return []
    loader_type = getattr(module, "DataLoader", None)
    iter_type = getattr(module, "_BaseDataLoaderIter", None)
    loaders: list[Any] = []
    iterators: list[Any] = []
    for o in gc.get_objects():
        t = type(o)
        if loader_type is not None and issubclass(t, loader_type):
            loaders.append(o)
        elif iter_type is not None and issubclass(t, iter_type):
            iterators.append(o)
    try:
        out = []
        by_dataset: dict[int, dict[str, Any]] = {}
        for dl in loaders:
            row = _loader(dl)
            by_dataset.setdefault(id(_attr(dl, "dataset")), row)
            out.append(row)
            if samplers is not None and row["sampler"].get("distributed") and row["sampler"].get("shuffle") is True:
                samplers[id(_attr(dl, "sampler"))] = (row, id(_attr(dl, "dataset")))
        for it in iterators:
            doc = _iterator(it)
            owner = by_dataset.get(id(_attr(it, "_dataset")))
            if owner is None:
                owner = {**{k: doc[k] for k in ("dataset", "batch_size", "drop_last", "num_workers",
                                                "pin_memory", "prefetch_factor",
                                                "persistent_workers")},
                         "type": "(loader not found)", "iterators": []}
                out.append(owner)
            owner["iterators"].append(doc)
            if track is not None:
                with contextlib.suppress(TypeError):  # a subclass with __slots__ and no weakref
                    track.append((doc, weakref.ref(it)))
        return out
    finally:
        loaders.clear()
        iterators.clear()


def _receiving(top: Any, stop: Any) -> bool:
    """Between the stack's top and ``stop`` (the loader's wait), a ready batch is being
    received (read from the pipe, unpickled, its tensors' shared memory mapped), not waited for."""
    f = top
    while f is not None and f is not stop:
        code = f.f_code
        if code.co_name in _RECEIVING or code.co_filename.endswith(_SHARING_FILES):
            return True
        f = f.f_back
    return False  # blocked in the queue's poll until a worker sends a batch


def classify(frame: Any) -> tuple[str, str]:
    """(category, where) of one thread's stack: waiting for the DataLoader's workers, receiving
    a batch they made, loading one in this thread, sleep, I/O wait, a lock, or running."""
    top = frame
    f = frame
    user = None
    in_loader = False
    wait_frame = None
    while f is not None:
        code = f.f_code
        if code.co_filename.endswith(_LOADER_FILE):
            if code.co_name in _LOADER_WAITS and wait_frame is None:
                wait_frame = f
            if code.co_name in _LOADER_CALLS:
                in_loader = True
                user = program_frame(f)
        f = f.f_back
    if in_loader:
        at = _where(user) if user is not None else "?"
        if wait_frame is not None and _receiving(top, wait_frame):
            return ("dataloader_receive",
                    f"DataLoader __next__ receiving a batch from a worker (called at {at})")
        if wait_frame is not None:
            return "dataloader_wait", f"DataLoader __next__ waiting for worker batches (called at {at})"
        return "dataloader_load", f"DataLoader __next__ loading in this thread (called at {at})"
    name = blocked_in(top)
    if name is not None and name in top.f_code.co_varnames:
        # A local passed as an argument (F.max_pool2d(input, ...)), not a blocking call: the
        # thread is running. thread_gate may err on the side of "parked"; an idle verdict may not.
        name = None
    if name is not None and _TORCH_DIR in top.f_code.co_filename:
        # torch waiting for its own work (a collective's work.wait(), a stream): the step's.
        name = None
    if name == "sleep":
        return "sleep", f"sleep at {_where(top)}{_in_program(top)}"
    if name in ("recv", "recv_into", "recvfrom", "read", "readinto", "readline", "accept",
                "select", "poll", "connect", "send", "sendall"):
        return "io", f"I/O ({name}) at {_where(top)}{_in_program(top)}"
    if name is not None:
        return "wait", f"waiting ({name}) at {_where(top)}{_in_program(top)}"
    return "running", f"running {_where(top)}{_in_program(top)}"


def _where(frame: Any) -> str:
    code = frame.f_code
    return f"{code.co_name}() {os.path.basename(code.co_filename)}:{frame.f_lineno}"


def _library_roots() -> tuple[str, ...]:
    """The standard library's directory (installed packages are told by their site-packages /
    dist-packages component). Not sysconfig: its data module is no part of the stdlib list."""
    stdlib = os.path.dirname(os.path.abspath(os.__file__))
    return (stdlib.rstrip(os.sep) + os.sep,)


_LIBRARY_ROOTS = (*_library_roots(), os.path.dirname(os.path.abspath(__file__)) + os.sep)
_LIBRARY_PARTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}", "<frozen")


def is_program_file(filename: str) -> bool:
    """The program's own code: not the standard library, an installed package or the agent."""
    return not (filename.startswith(_LIBRARY_ROOTS) or any(p in filename for p in _LIBRARY_PARTS)
                or filename.startswith("<"))


def program_frame(frame: Any) -> Any:
    """The innermost frame of the program's own code on this stack (None: library code only)."""
    f = frame
    while f is not None and not is_program_file(f.f_code.co_filename):
        f = f.f_back
    return f


def _in_program(top: Any) -> str:
    """`` (in train() train.py:57)``: where the program is, when the stack's top is a library's."""
    user = program_frame(top)
    return "" if user is None or user is top else f" (in {_where(user)})"


def sample_threads(seconds: float, interval: float = 0.01,
                   cancelled: Callable[[], bool] | None = None) -> list[dict[str, Any]]:
    """Where each non-agent thread spends its time: shares of samples per category and place."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    counts: dict[int, dict[tuple[str, str], int]] = {}
    totals: dict[int, int] = {}
    deadline = time.monotonic() + max(seconds, interval)
    while time.monotonic() < deadline:
        frames: dict[int, Any] = sys._current_frames()
        frame: Any = None
        try:
            for ident, frame in frames.items():
                name = names.get(ident) or next((t.name for t in threading.enumerate()
                                                 if t.ident == ident), str(ident))
                names[ident] = name
                if ident == me or name.startswith(AGENT_THREAD_PREFIX):
                    continue
                key = classify(frame)
                per = counts.setdefault(ident, {})
                per[key] = per.get(key, 0) + 1
                totals[ident] = totals.get(ident, 0) + 1
        finally:
            frames.clear()
            frame = None
        if cancelled is not None and cancelled():
            break
        time.sleep(interval)
    out: list[dict[str, Any]] = []
    for ident, per in counts.items():
        n = totals[ident]
        places = sorted(per.items(), key=lambda kv: -kv[1])
        shares: dict[str, float] = {}
        for (category, _), c in per.items():
            shares[category] = shares.get(category, 0.0) + c / n
        out.append({"thread": names.get(ident, str(ident)), "samples": n,
                    "shares": {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])},
                    "top": [{"category": c, "where": w, "share": round(k / n, 3)}
                            for (c, w), k in places[:5]]})
    out.sort(key=lambda r: (r["thread"] != "MainThread", -r["shares"].get("dataloader_wait", 0.0)))
    return out


NEXT_SPEC = {"module": "torch.utils.data.dataloader", "class": "_BaseDataLoaderIter",
             "method": "__next__"}
# iter(loader): where a loader without persistent workers starts them again, every epoch (and
# every phase of a train/val loop): time the loop waits for the DataLoader too.
ITER_SPEC = {"module": "torch.utils.data.dataloader", "class": "DataLoader", "method": "__iter__"}
_MAX_TIMED = 100_000
_MAX_EPOCHS_SEEN = 16
# How far away the end of the loop's epoch may be for the window to wait for the workers'
# start it brings (a loader without persistent workers): a start costs the loop 20-60 ms
# here, which a window holds or not by chance; an epoch further off than this spreads it
# over enough batches to matter less (40 ms over 3 s: 1.3 points of share).
START_WAIT_S = 3.0


class NextTimer:
    """Times every ``next()`` of a DataLoader iterator, per thread, for hooks.install.

    The DataLoader's share of a loop, measured the way the loop itself would (time in next()
    over the time between batches), without a profiler's overhead slowing the loop down: over
    whole periods only, from one thread's first observed next() to its last, so that a call cut
    by either end of the window never counts.

    ``iter(loader)`` is timed too (``on_iter_exit``): starting an epoch's workers (25-40 ms
    for 2 workers here, each phase of a tutorial's train/val loop) is the loop waiting for its
    DataLoader, as the ImageNet example's Data meter counts it; ``starts``/``start_s`` say how
    much of ``next_s`` it was. Without it a transfer-learning loop read 4.7-5.4 % against its
    own meters' 7.4-8.1 %. A window holds a start or not by chance (the same loop read 9.2 %
    with one, 4.8 % without): ``share_epochs`` spreads the starts over the epochs they begin
    (``len()`` of each loader the loop iterates, one start each), as a loop's own meter does
    over its run.

    Garbage collections are taken out of both (``on_gc``, a gc callback): a collection stops
    every thread wherever it is, and one triggered by a batch's allocations lands inside
    ``next()``. The agent's own objects make collections longer (a Lightning loop's next()
    read 26-29 % of the loop in 1 sample of 5 after a census or a profile, 10-11 % in the others,
    and with no agent no next() call ever took 20 ms).
    """

    def __init__(self) -> None:
        # per thread: (start, end, hooks_s, gc_s, gc_inside, is_start, dataset key)
        self._calls: dict[int, list[tuple[float, float, float, float, float, bool, int]]] = {}
        self._lock = threading.Lock()
        self._n = 0
        # Batches an epoch of each dataset's loader holds (None: not known, e.g. an
        # IterableDataset), keyed by the dataset's id: read once per loader, in the hook.
        self.lengths: dict[int, int | None] = {}
        # Per shuffling DistributedSampler's id, its epoch as each iter() of its loader left it,
        # with the batches its loader gave since the iter() before (or the window's start):
        # set_epoch() is called before iter() every epoch, or the order repeats (issue 18); a
        # peek (`next(iter(loader))` to log a sample) is an iter() that is no epoch.
        self.sampler_epochs: dict[int, list[tuple[int, int]]] = {}
        self._since_start: dict[int, int] = {}  # per loader (its dataset's id)
        # Backward passes per loader (its dataset's id), counted to the loader whose batch the
        # thread took last: a loader whose batches are trained on, not an evaluation's.
        self.backwards: dict[int, int] = {}
        self._last_key: dict[int, int] = {}
        # Seconds the agent's other hooks took so far (graph_use.GraphUse.overhead_s), read at
        # each next(): the loop they lengthen is measured without them.
        self.overhead: Callable[[], float] | None = None
        self.gc_s = 0.0  # seconds of garbage collection since the timer was made
        self._gc_started: float | None = None

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """A gc callback: collections run one at a time, with the GIL held."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.gc_s += time.perf_counter() - self._gc_started
            self._gc_started = None

    def on_enter(self, args: Any, kwargs: Any) -> tuple[float, float, float, int]:
        """next(iterator): the iterator's dataset says which loader's epoch it is."""
        key = self._key(_attr(args[0], "_dataset") if args else None, args[0] if args else None)
        overhead = self.overhead
        return (time.perf_counter(), overhead() if overhead is not None else 0.0, self.gc_s, key)

    def on_iter_enter(self, args: Any, kwargs: Any) -> tuple[float, float, float, int, Any]:
        """iter(loader): its epoch's length is read from the iterator it returns, if new, and
        its sampler's epoch once the iterator has drawn its first indices."""
        key = id(_attr(args[0], "dataset")) if args else 0
        sampler = _attr(args[0], "sampler") if args else None
        overhead = self.overhead
        return (time.perf_counter(), overhead() if overhead is not None else 0.0, self.gc_s, key,
                sampler if distributed_sampler(sampler) else None)

    def on_backward_enter(self, args: Any, kwargs: Any) -> None:
        key = self._last_key.get(threading.get_ident())
        if key is not None:
            self.backwards[key] = self.backwards.get(key, 0) + 1

    def on_exit(self, token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        self._record(token, elapsed_ns, False)

    def on_iter_exit(self, token: Any, value: Any, exc: BaseException | None, elapsed_ns: int) -> None:
        if isinstance(token, tuple) and len(token) > 3 and value is not None:
            self._key(_attr(value, "_dataset"), value)
        if isinstance(token, tuple) and len(token) > 4 and token[4] is not None:
            epoch = _attr(token[4], "epoch")
            seen = self.sampler_epochs.setdefault(id(token[4]), [])
            if type(epoch) is int and len(seen) < _MAX_EPOCHS_SEEN:
                seen.append((epoch, self._since_start.get(token[3], 0)))
            self._since_start[token[3]] = 0
        self._record(token, elapsed_ns, True)

    def _key(self, dataset: Any, iterator: Any) -> int:
        key = id(dataset)
        if key not in self.lengths and iterator is not None:
            self.lengths[key] = epoch_batches(iterator)
        return key

    def _record(self, token: Any, elapsed_ns: int, is_start: bool) -> None:
        if not isinstance(token, tuple):
            return
        start, hooks_s, gc_s = token[:3]
        key = token[3] if len(token) > 3 else 0
        gc_inside = self.gc_s - gc_s
        if not is_start:
            self._last_key[threading.get_ident()] = key
            self._since_start[key] = self._since_start.get(key, 0) + 1
        with self._lock:
            if self._n >= _MAX_TIMED:
                return
            self._n += 1
            self._calls.setdefault(threading.get_ident(), []).append(
                (start, start + elapsed_ns / 1e9, hooks_s, gc_s, gc_inside, is_start, key))

    def starts_seen(self) -> int:
        with self._lock:
            return sum(1 for spans in self._calls.values() for span in spans if span[5])

    def batches_after_start(self) -> int:
        """next() calls after the latest start, in its thread (0 before any start)."""
        with self._lock:
            spans = [sorted(v) for v in self._calls.values() if any(span[5] for span in v)]
        if not spans:
            return 0
        latest = max(spans, key=lambda v: max(span[0] for span in v if span[5]))
        at = max(span[0] for span in latest if span[5])
        return sum(1 for span in latest if not span[5] and span[0] > at)

    def summary(self, names: dict[int, str]) -> list[dict[str, Any]]:
        """Per thread with >= 3 calls: calls, seconds in next() and the share of the loop (the
        seconds the agent's other hooks took meanwhile taken out of the loop's time), and the
        share over whole epochs where it can be told (``_over_epochs``)."""
        with self._lock:
            calls = {k: sorted(v) for k, v in self._calls.items()}
        out: list[dict[str, Any]] = []
        for ident, spans in calls.items():
            if sum(1 for span in spans if not span[5]) < 3:
                continue
            first, last = spans[0][0], spans[-1][0]
            whole = [(s, e, gc, it, key) for s, e, _, _, gc, it, key in spans if s < last]
            inside = sum(max(0.0, e - s - gc) for s, e, gc, _, _ in whole)
            starts = [max(0.0, e - s - gc) for s, e, gc, it, _ in whole if it]
            hooks_s = max(0.0, spans[-1][2] - spans[0][2])
            gc_s = max(0.0, spans[-1][3] - spans[0][3])
            window = last - first - hooks_s - gc_s
            row: dict[str, Any] = {
                "thread": names.get(ident, str(ident)), "batches": len(whole) - len(starts),
                "next_s": round(inside, 4), "window_s": round(window, 4),
                "share": round(inside / window, 4) if window > 0 else None}
            if starts:
                row["starts"] = len(starts)
                row["start_s"] = round(sum(starts), 4)
            if hooks_s:
                row["hooks_s"] = round(hooks_s, 4)
            if gc_s:
                row["gc_s"] = round(gc_s, 4)
            if window > 0:
                row.update(self._over_epochs(whole, window))
            out.append(row)
        out.sort(key=lambda r: -int(r["batches"]))
        return out

    def _over_epochs(self, whole: list[tuple[float, float, float, bool, int]],
                     window: float) -> dict[str, Any]:
        """The loop's DataLoader share over whole epochs: each loader it iterates starts once an
        epoch of ``len(loader)`` batches, at the cost the window's starts took (iter() and the
        first batch's wait beyond a usual one's). Nothing where a loader's length is unknown or
        no start was seen (the caller says whether one could have cost anything)."""
        keys = {key for _, _, _, _, key in whole}
        lengths = [self.lengths.get(key) for key in keys]
        if not keys or any(not n for n in lengths):
            return {}
        cycle = sum(n for n in lengths if n)
        steady: list[float] = []
        episodes: list[tuple[float, float | None]] = []  # (iter() time, its first batch's wait)
        after_start = False
        for s, e, collected, is_start, _ in whole:
            spent = max(0.0, e - s - collected)
            if is_start:
                episodes.append((spent, None))
                after_start = True
            elif after_start:
                episodes[-1] = (episodes[-1][0], spent)
                after_start = False
            else:
                steady.append(spent)
        if not episodes or not steady:
            return {"epoch_batches": cycle}
        usual = sum(steady) / len(steady)
        costs = [it + max(0.0, (first if first is not None else usual) - usual)
                 for it, first in episodes]
        batches = sum(1 for *_, is_start, _ in whole if not is_start)
        period = (window - sum(costs)) / batches if batches else 0.0
        if period <= 0:
            return {"epoch_batches": cycle}
        per_batch = len(keys) * (sum(costs) / len(costs)) / cycle
        return {"epoch_batches": cycle, "start_cost_s": round(sum(costs) / len(costs), 4),
                "share_epochs": round((usual + per_batch) / (period + per_batch), 4)}


def epoch_batches(iterator: Any) -> int | None:
    """``len()`` of a DataLoader iterator over a map-style dataset: the batches of its epoch
    (an IterableDataset's ``__len__`` is the user's guess, and DataLoader warns about it)."""
    if _attr(iterator, "_dataset_kind") != 0:
        return None
    try:
        n = len(_attr(iterator, "_index_sampler"))
    except Exception:
        return None
    return n if isinstance(n, int) and n > 0 else None


def state(sample_seconds: float = 1.0, cancelled: Callable[[], bool] | None = None,
          timer: NextTimer | None = None, sample_if_none: float | None = None) -> dict[str, Any]:
    """Loaders, their workers (with CPU use over the sampling window) and the threads' waits.

    Counters are those at the end of the window, with the batches the loop took during it: a
    reading taken only at the start says nothing about the rate the loop is fed at. ``timer``
    (hooked by the caller for the window): the DataLoader's share of each loop, timed.
    """
    track: list[tuple[dict[str, Any], Any]] = []
    samplers: dict[int, tuple[dict[str, Any], int]] = {}
    loaders = find_loaders(track, samplers)
    if not loaders and sample_if_none is not None and sample_seconds > 0:
        sample_seconds = sample_if_none
    t0 = time.monotonic()
    threads = sample_threads(sample_seconds, cancelled=cancelled) if sample_seconds > 0 else []
    elapsed = time.monotonic() - t0
    next_start: float | None = None  # seconds until the loop's epoch ends and workers start
    for doc, ref in track:
        if elapsed <= 0.05:
            break
        it = ref()
        if it is None:
            doc["ended_during_window"] = True
            continue
        before = doc["batches_yielded"]
        now = _attr(it, "_num_yielded")
        doc["batches_in_flight"] = _plain(_attr(it, "_tasks_outstanding"))
        starting = doc.get("num_workers") and not doc.get("persistent_workers")
        length = doc.get("epoch_batches") if starting or doc.get("distributed_shuffle") else None
        it = None
        if isinstance(before, int) and isinstance(now, int):
            doc["batches_yielded"] = now
            doc["batches_in_window"] = now - before
            doc["batches_per_s"] = round((now - before) / elapsed, 2)
            if length and now > before:
                ends = (length - now) / ((now - before) / elapsed)
                next_start = ends if next_start is None else min(next_start, ends)
    track.clear()
    waited = 0.0
    if timer is not None and next_start is not None and next_start <= START_WAIT_S \
            and not timer.starts_seen():
        waited = _wait_for_start(timer, next_start + 1.0, cancelled)
    for loader in loaders:
        for it_doc in loader["iterators"]:
            for w in it_doc["workers"]:
                if w.get("pid") and w.get("cpu_s") is not None and elapsed > 0.05:
                    later = _proc(int(w["pid"]))
                    if later.get("cpu_s") is not None:
                        w["cpu_percent"] = round(100.0 * (later["cpu_s"] - w["cpu_s"]) / elapsed, 1)
                        w["state"] = later["state"]
                        w["rss_bytes"] = later["rss_bytes"]
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    result: dict[str, Any] = {"loaders": loaders, "threads": threads,
                              "sampled_s": round(elapsed, 3), "cpus": cpus}
    if waited:
        result["waited_for_start_s"] = round(waited, 3)
    ranks = ranks_here()
    if ranks is not None:
        result["ranks_here"] = ranks
    if timer is not None:
        result["next_timing"] = timer.summary({t.ident or 0: t.name for t in threading.enumerate()})
        for sampler_id, (row, key) in samplers.items():
            _follow_epochs(row, timer.sampler_epochs.get(sampler_id, []), timer.backwards.get(key, 0),
                           timer.lengths.get(key))
    samplers.clear()
    return result


def _follow_epochs(row: dict[str, Any], at_starts: list[tuple[int, int]], backwards: int,
                   length: int | None) -> None:
    """What the window saw of a shuffling DistributedSampler's epochs: its value as each new
    epoch of its loader began, and how many of those began with the value the epoch before
    had. An epoch before counts once its loader gave at least half of ``length`` batches in it
    (an iter() that took one batch to log is no epoch), the window's first reading included
    when the loader was inside an epoch then (an iterator that had yielded some but not all of
    its batches)."""
    sampler = row["sampler"]
    run = 0
    for it in row.get("iterators") or []:
        yielded, total = it.get("batches_yielded"), it.get("epoch_batches")
        if isinstance(yielded, int) and isinstance(total, int):
            yielded -= int(it.get("batches_in_window") or 0)
            if 0 < yielded < total:
                run = max(run, yielded)
    previous = sampler.get("epoch") if run else None
    unchanged = 0
    for epoch, before in at_starts:
        run += before
        if previous is not None and length and 2 * run >= length and epoch == previous:
            unchanged += 1
        previous, run = epoch, 0
    sampler.update({"starts_seen": len(at_starts), "epochs_at_starts": [e for e, _ in at_starts[:8]],
                    "unchanged_at_starts": unchanged, "backward_passes": backwards})


def _wait_for_start(timer: NextTimer, limit: float,
                    cancelled: Callable[[], bool] | None) -> float:
    """Keep timing until workers start again and two batches follow, for ``limit`` s at most."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and timer.batches_after_start() < 2:
        if cancelled is not None and cancelled():
            break
        time.sleep(0.02)
    return time.monotonic() - t0


_LOOPBACK = ("localhost", "127.0.0.1", "::1", "ip6-localhost")


def ranks_here() -> int | None:
    """How many ranks of this process's job share this machine's CPUs (their DataLoader
    workers too): torchrun's LOCAL_WORLD_SIZE, else, for ranks started by
    ``torch.multiprocessing.spawn`` (the DDP tutorial's ``demo_basic``), the process group's
    size when its rendezvous is on this machine. None for a job of one process, or when it
    cannot be told."""
    with contextlib.suppress(ValueError):
        n = int(os.environ.get("LOCAL_WORLD_SIZE", ""))
        return n if n > 1 else None
    dist = sys.modules.get("torch.distributed")
    if dist is None or os.environ.get("MASTER_ADDR", "").lower() not in _LOOPBACK:
        return None
    try:
        n = int(dist.get_world_size()) if dist.is_available() and dist.is_initialized() else 0
    except Exception:  # never into the target: a group being torn down
        return None
    return n if n > 1 else None


def _forget_gc_callbacks_in_forked_child() -> None:
    """A DataLoader worker forked while a timer runs inherits its gc callback, which no request
    there will ever remove: the child gets its gc.callbacks back."""
    with contextlib.suppress(Exception):  # never break the user's fork
        gc.callbacks[:] = [cb for cb in gc.callbacks
                           if type(getattr(cb, "__self__", None)) is not NextTimer]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_gc_callbacks_in_forked_child)
