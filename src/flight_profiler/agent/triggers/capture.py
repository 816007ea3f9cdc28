"""What the triggers capture when they fire: stacks, the program's own frame, memory, a census.

Nothing here keeps a reference to the target's objects once it returns: frames become
{file, line, function} dicts, tensors become the census document.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

from .. import safepoint, thread_gate
from ..registry import Context

_AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The standard library's directory, from a module that is always there (sysconfig would import
# its data module, which the agent must not).
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
_LIBRARIES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def is_program_file(path: str) -> bool:
    """A file of the program itself: not the standard library, not an installed library, not
    ours (a hook's generated frame, the agent's modules)."""
    if not path or path.startswith("<"):
        return False
    if path.startswith(_STDLIB) and not any(lib in path for lib in _LIBRARIES):
        return False
    if any(lib in path for lib in _LIBRARIES):
        return False
    return not path.startswith(_AGENT_DIR)


def program_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame of the program's own code (frames outermost first), else the
    innermost frame that is not ours."""
    for frame in reversed(frames):
        if is_program_file(str(frame.get("file", ""))):
            return dict(frame)
    for frame in reversed(frames):
        name = str(frame.get("file", ""))
        if not name.startswith(_AGENT_DIR) and not name.startswith("<flight_profiler"):
            return dict(frame)
    return frames[-1] if frames else None


def stack_sample() -> dict[str, Any]:
    """Every thread's stack with its kernel counters (the ``stack --progress`` result), timed."""
    from ..commands import stack

    sample = stack.handle(Context({"progress": True}))
    sample["time"] = time.time()
    return sample


def traceback_frames(exc: BaseException, limit: int = 64) -> list[dict[str, Any]]:
    """The frames an exception went through, outermost first, as plain dicts."""
    out = []
    for entry in traceback.extract_tb(exc.__traceback__)[-limit:]:
        out.append({"file": entry.filename, "line": entry.lineno, "function": entry.name,
                    "code": (entry.line or "").strip()[:200]})
    return out


def traceback_roots(exc: BaseException, thread: str) -> list[tuple[str, Any]]:
    """The locals of the frames an exception unwound, as census roots named as the census names
    a running function's (``main() local predictions``): once it reached the excepthook those
    frames are on no thread's stack, yet what they hold is still alive (and is the memory)."""
    from ..holder_paths import frame_prefix

    roots: list[tuple[str, Any]] = []
    tb = exc.__traceback__
    frame: Any = None
    while tb is not None and len(roots) < 10_000:
        frame = tb.tb_frame
        code = frame.f_code
        if is_program_file(code.co_filename):
            prefix = frame_prefix(thread, str(frame.f_globals.get("__name__", "?")), code.co_name)
            roots += [(f"{prefix} {name}", value) for name, value in frame.f_locals.items()]
        tb = tb.tb_next
    frame = None
    return roots


def current_frames(skip: int = 1, limit: int = 64) -> list[dict[str, Any]]:
    """The calling thread's own stack, outermost first (the caller's frames left out)."""
    out = []
    for entry in traceback.extract_stack(sys._getframe(skip))[-limit:]:
        out.append({"file": entry.filename, "line": entry.lineno, "function": entry.name,
                    "code": (entry.line or "").strip()[:200]})
    return out


def rank_info() -> dict[str, Any]:
    """The rank of a torchrun job (environment first: it needs no torch call)."""
    env = os.environ
    info: dict[str, Any] = {}
    for key, name in (("RANK", "rank"), ("LOCAL_RANK", "local_rank"), ("WORLD_SIZE", "world_size")):
        value = env.get(key, "")
        if value.isdigit():
            info[name] = int(value)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            info.setdefault("rank", int(dist.get_rank()))
            info.setdefault("world_size", int(dist.get_world_size()))
            info["backend"] = str(dist.get_backend())
    except Exception:
        pass
    return info


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def cuda_devices(torch: Any) -> list[dict[str, Any]]:
    """Allocator figures per device (no tensor walk; safe from any thread)."""
    out: list[dict[str, Any]] = []
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not (cuda.is_available() and cuda.is_initialized()):
            return out
        for i in range(cuda.device_count()):
            free, total = cuda.mem_get_info(i)
            out.append({"device": i, "allocated": int(cuda.memory_allocated(i)),
                        "reserved": int(cuda.memory_reserved(i)),
                        "peak_allocated": int(cuda.max_memory_allocated(i)),
                        "free": int(free), "total": int(total)})
    except Exception:
        pass
    return out


def census(torch: Any, seconds: float, label: str, extra_roots: list[tuple[str, Any]] | None = None,
           ) -> tuple[dict[str, Any] | None, str | None]:
    """A tensor census taken where no other thread can be inside a torch op (safepoint.py):
    every other thread held, or in the main thread. (census, None) or (None, why not).
    ``extra_roots``: (path, value) walked as roots too (the locals of an exception's frames)."""
    from .. import tensor_census

    def take() -> dict[str, Any]:
        return tensor_census.take(torch, label=label, seconds=seconds, extra_roots=extra_roots)

    try:
        if thread_gate.supported() and not safepoint._torch_profiler_running():
            doc: dict[str, Any] = thread_gate.run_with_threads_held(take, timeout=2.0)
        elif threading.current_thread() is threading.main_thread():
            doc = take()
        else:
            doc = safepoint.run_in_main_thread(take, timeout=5.0)
    except (thread_gate.GateTimeout, safepoint.SafePointTimeout) as exc:
        return None, f"census skipped: {exc}"
    except MemoryError:
        return None, "census skipped: out of memory while taking it"
    except Exception as exc:
        return None, f"census failed: {type(exc).__name__}: {exc}"
    doc.pop("walked_objects", None)
    return doc, None


def census_top(doc: dict[str, Any], n: int = 5) -> list[dict[str, Any]]:
    """The biggest holders of a census, small enough for event.json."""
    rows = []
    for holder in (doc.get("holders") or [])[:n]:
        if isinstance(holder, dict):
            rows.append({k: holder.get(k) for k in ("path", "bytes", "count", "kind") if k in holder})
    return rows
