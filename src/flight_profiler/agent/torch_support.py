"""What every torch command needs inside the target: torch (only if already imported), CUDA
state without initialising CUDA, output paths, atomic pickle/JSON writes, and a guard that
keeps PyTorch's native log lines out of the target's stderr.

Standard library only; ``torch`` is reached through ``sys.modules`` and never imported here.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import pickle
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import IO, Any

from . import agent_log
from .atomic import write_atomic
from .importing import still_importing
from .protocol import ERR_TORCH_MISSING, ERR_USAGE, HELD_STDERR
from .registry import CommandError

# Snapshot pickles are read by our report through a restricted unpickler and by PyTorch's
# memory_viz through plain pickle: protocol 4 of plain containers suits both.
PICKLE_PROTOCOL = 4

# Lines kineto prints on stderr by itself (fprintf / its own logger) when a profiler starts or
# stops (e.g. "USDT:2026-11-22 02:17:11 4951:4951 SyncActivityProfilerHandler.cpp:52]
# profiler_start"); they are noise in someone else's process.
_NATIVE_NOISE = re.compile(
    rb"^(?:(?:USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\]"
    rb"|ERROR: External init callback must run in same thread as registerClient"
    rb"|\[W\d{4} [\d:.]+ (?:\d+ )?CPUAllocator\.cpp:\d+\] Memory block of unknown size)"
)
# c10 warnings from the profiler's own sources, printed by OUR session's start or stop: a
# session over all threads that stops while another thread is inside an op finds that op with
# no end ("collection.cpp:664] Warning: aten::addmm (function operator())", a SOFT_ASSERT on its
# end time), or a shape recorded while the op changed it ("collection.cpp:212] Expected Tensor
# Strides mismatch ..."). They say something about our trace, not about the target: they are
# kept off its stderr and told to the user with the answer (profiler_warnings()).
_PROFILER_WARNING = re.compile(
    rb"^\[W\d{4} [\d:.]+ (?:\d+ )?(?:collection|profiler_kineto|profiler_python|kineto_shim)"
    rb"\.cpp:\d+\] (?:Warning: )?(.*?)\s*$"
)
_WARNINGS_KEPT = 8
_warnings_lock = threading.Lock()
_warnings_seen: dict[str, int] = {}  # message -> times; bounded by _WARNINGS_KEPT


def _keep_profiler_warning(line: bytes) -> bool:
    """Whether ``line`` is one of torch's profiler warnings (counted for profiler_warnings())."""
    match = _PROFILER_WARNING.match(line)
    if match is None:
        return False
    message = match.group(1).decode("utf-8", "replace")[:200]
    with _warnings_lock:
        if message in _warnings_seen or len(_warnings_seen) < _WARNINGS_KEPT:
            _warnings_seen[message] = _warnings_seen.get(message, 0) + 1
    return True


def profiler_warnings() -> list[str]:
    """torch's profiler warnings kept off the target's stderr since the last call, as lines
    for the answer ("aten::addmm (function operator()) x2"); the record is emptied."""
    with _warnings_lock:
        seen = dict(_warnings_seen)
        _warnings_seen.clear()
    return [f"{message} x{times}" if times > 1 else message for message, times in seen.items()]


def get_torch() -> Any:
    """The target's torch module, or a torch_missing CommandError (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is not None and still_importing(torch):
        raise CommandError(
            "the target is still importing torch",
            "try again in a few seconds, once its `import torch` has finished",
            ERR_TORCH_MISSING,
        )
    if torch is None or not hasattr(torch, "Tensor"):
        raise CommandError(
            "the target has not imported torch",
            "torch commands work once the program has run `import torch`; "
            "nothing was imported into it",
            ERR_TORCH_MISSING,
        )
    return torch


def cuda_in_use(torch: Any) -> bool:
    """True when the target has CUDA AND has initialised it.

    A target that never touched CUDA holds no CUDA memory; asking the allocator would create
    a CUDA context (hundreds of MB per device) in someone else's process.
    """
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available() and cuda.is_initialized())
    except Exception:
        return False


def rss_bytes() -> int:
    """Resident set size from /proc/self/statm (field 2, in pages)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def output_path(ctx_args: dict[str, Any], kind: str, ext: str) -> str:
    """The absolute path to write: ``path`` as the CLI resolved it, else a default name.

    Default: ``fp-<pid>-<kind>-<YYYYmmdd-HHMMSS>.<ext>`` in ``default_dir`` (the CLI's cwd,
    sent absolute), or the agent's cwd when no CLI told us.
    """
    path = ctx_args.get("path")
    if path:
        path = str(path)
        if not os.path.isabs(path):
            raise CommandError(f"output path {path!r} is not absolute", "the CLI sends absolute paths", ERR_USAGE)
        return path
    directory = str(ctx_args.get("default_dir") or os.getcwd())
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
    return os.path.join(directory, f"fp-{os.getpid()}-{kind}-{stamp}.{ext}")


def check_writable(path: str) -> None:
    """Fail before doing any work if the file cannot be created (clear message, no traceback)."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise CommandError(f"directory {directory} does not exist", "create it or pass another -f", ERR_USAGE)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CommandError(
            f"the target process cannot write to {directory}",
            "the file is written by the target's user; pass -f in a directory it can write",
            ERR_USAGE,
        )


def write_pickle(path: str, obj: Any) -> int:
    data = pickle.dumps(obj, protocol=PICKLE_PROTOCOL)

    def write(f: IO[bytes]) -> None:
        f.write(data)

    return write_atomic(path, write)


# gzip's fastest level: a with_stack trace of 3 LBFGS steps (70 MB of JSON) took 0.7 s to
# compress at level 6 and 0.27 s at 1, in the target's process, for 5 MB instead of 4.
GZIP_LEVEL = 1


def write_json(path: str, obj: Any) -> int:
    """JSON to ``path`` atomically; gzip when the name ends in .gz."""

    def write(f: IO[bytes]) -> None:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
                _dump_json(obj, gz)
        else:
            _dump_json(obj, f)

    return write_atomic(path, write)


_WRITE_BLOCK = 1 << 20


def write_blocks(path: str, blocks: Iterable[bytes]) -> int:
    """Bytes to ``path`` atomically, gzip-compressed when the name ends in .gz."""

    def write(f: IO[bytes]) -> None:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
                for block in blocks:
                    gz.write(block)
        else:
            for block in blocks:
                f.write(block)

    return write_atomic(path, write)


# Items of a long list encoded by one json.dumps call: the C encoder holds the GIL for the
# whole call (no bytecode runs to hand it over), ~3 ms for 1,000 trace events here.
_DUMP_SLICE = 1000


def _dump_json(obj: Any, f: IO[bytes] | gzip.GzipFile) -> None:
    """``obj`` as compact JSON, the bytes json.dumps would give. Long lists (a trace's events)
    are encoded a slice at a time by the C encoder and written in ~1 MB blocks: one dumps of a
    whole trace holds the target's GIL for seconds and its text in memory, and iterencode is
    the pure-Python encoder (a 138,000-event trace: 3.7 s; sliced: a fraction of it). Each
    write (zlib, the file) releases the GIL between slices."""
    dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
    block: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        block.append(text)
        size += len(text)
        if size >= _WRITE_BLOCK:
            f.write("".join(block).encode("utf-8"))
            block.clear()
            size = 0

    def value(v: Any) -> None:
        if isinstance(v, list) and len(v) > _DUMP_SLICE:
            put("[")
            for i in range(0, len(v), _DUMP_SLICE):
                put(("," if i else "") + dumps(v[i:i + _DUMP_SLICE])[1:-1])
            put("]")
        else:
            put(dumps(v))

    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        put("{")
        for i, (k, v) in enumerate(obj.items()):
            put(("," if i else "") + dumps(k) + ":")
            value(v)
        put("}")
    else:
        value(obj)
    if block:
        f.write("".join(block).encode("utf-8"))


def plain(obj: Any, depth: int = 0) -> Any:
    """``obj`` as plain dict/list/str/int/float/bool/None (tuples become lists).

    Our report's restricted unpickler accepts nothing else; anything exotic becomes its str().
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if depth > 64:
        return str(obj)
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (str, int)) else k: plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v, depth + 1) for v in obj]
    return str(obj)


_held_count = itertools.count(1)


def _held_file() -> tuple[Any, str | None]:
    """Where fd 2 points while held: a new file beside the agent's log (in its private 0700
    directory), which outlives the process if it dies meanwhile, so that its last words (an
    abort's message, faulthandler's traceback) are not lost with an unlinked temp file; an
    anonymous temp file when the agent has no log."""
    log = agent_log.LOG.path
    if log.endswith(".log"):
        path = f"{log[:-4]}{HELD_STDERR}{os.getpid()}-{next(_held_count)}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            pass
        else:
            return os.fdopen(fd, "w+b"), path
    return tempfile.TemporaryFile(), None


class QuietStderr:
    """Keep PyTorch's native log lines out of the target's stderr, and nothing else.

    fd 2 is pointed at a temp file while active; on ``close()`` whatever the target itself
    wrote meanwhile is copied back to its stderr unchanged, minus the lines PyTorch's native
    profiler printed (kineto's USDT/STAGE lines, its "External init callback" complaint when a
    profiler starts outside the thread that imported torch, c10's one-time "Memory block of
    unknown size" warning under profile_memory). ``close()`` is idempotent and may run in
    any thread. With ``python_warnings`` Python warnings are suppressed meanwhile too (only
    for short windows: warning filters are process-wide).
    """

    def __init__(self, python_warnings: bool = True) -> None:
        self._saved = -1
        self._tmp: Any = None
        self._held: str | None = None
        self._catch: Any = None
        self._lock = threading.Lock()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if python_warnings:
            self._catch = warnings.catch_warnings()
            self._catch.__enter__()
            warnings.simplefilter("ignore")
        try:
            tmp, held = _held_file()
        except OSError:
            return
        try:
            saved = os.dup(2)
        except OSError:
            _drop(tmp, held)
            return
        try:
            os.dup2(tmp.fileno(), 2)
        except OSError:
            os.close(saved)
            _drop(tmp, held)
            return
        self._saved, self._tmp, self._held = saved, tmp, held

    def close(self) -> None:
        with self._lock:
            saved, tmp, catch, held = self._saved, self._tmp, self._catch, self._held
            self._saved, self._tmp, self._catch, self._held = -1, None, None, None
        if catch is not None:
            catch.__exit__(None, None, None)
        if saved < 0:
            return
        os.dup2(saved, 2)
        os.close(saved)
        try:
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(True)
                    if not _NATIVE_NOISE.match(line) and not _keep_profiler_warning(line)]
            if kept:
                os.write(2, b"".join(kept))
        except OSError:
            pass
        finally:
            _drop(tmp, held)


def _drop(tmp: Any, held: str | None) -> None:
    tmp.close()
    if held is not None:
        with contextlib.suppress(OSError):
            os.unlink(held)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """QuietStderr around a short block (a profiler start, stop or export)."""
    quiet = QuietStderr()
    try:
        yield
    finally:
        quiet.close()


def file_result(path: str, size: int) -> dict[str, Any]:
    return {"path": path, "size": size}


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
