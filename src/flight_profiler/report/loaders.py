"""Find the inputs (files, TensorBoard profiler directories) and read each by its content.

Detection never trusts the extension: gzip is recognised by its magic bytes, pickles by their
protocol header, a census by its ``format`` key, anything else JSON is streamed as a trace.
One unreadable file becomes an ``InputResult(ok=False, error=...)``; the others go on.
"""

from __future__ import annotations

import glob
import gzip
import os
import pickle
import time
import zlib
from typing import Any

from flight_profiler.report.census import CensusFormatError, parse_census
from flight_profiler.report.grads import GradsFormatError, parse_grads
from flight_profiler.report.jsonstream import TraceFormatError
from flight_profiler.report.models import InputResult
from flight_profiler.report.safe_pickle import UnsafePickle, looks_like_pickle
from flight_profiler.report.snapshot import SnapshotFormatError, parse_snapshot
from flight_profiler.report.trace_loader import load_trace
from flight_profiler.report.trace_metrics import trace_metrics

MAX_SNIFF = 64 * 1024
TRACE_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz", "*.trace.json", "*.trace.json.gz")


def expand(paths: list[str]) -> list[str]:
    """Files as given; a directory becomes the traces under it (TensorBoard layout:
    ``plugins/profile/<run>/*.pt.trace.json[.gz]``), plus the pickles and JSON files beside them."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            found: set[str] = set()
            for pattern in TRACE_PATTERNS:
                found.update(glob.glob(os.path.join(p, "**", pattern), recursive=True))
            # Snapshots and censuses beside them (and any other JSON: detected by content).
            for pattern in ("*.pickle", "*.pkl", "*.json", "*.json.gz"):
                found.update(glob.glob(os.path.join(p, "**", pattern), recursive=True))
            out.extend(sorted(found) if found else [p])
        else:
            out.append(p)
    return out


def _head(path: str) -> tuple[bytes, bool]:
    with open(path, "rb") as fh:
        head = fh.read(MAX_SNIFF)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as gz:
                return gz.read(MAX_SNIFF), True
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"corrupt gzip data: {exc}") from None
    return head, False


def _read_all(path: str, gz: bool) -> bytes:
    if gz:
        try:
            with gzip.open(path, "rb") as fh:
                return fh.read()
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"corrupt or truncated gzip data: {exc}") from None
    with open(path, "rb") as fh:
        return fh.read()


def load_one(path: str) -> InputResult:
    t0 = time.perf_counter()
    result = _load(path)
    result.elapsed_s = time.perf_counter() - t0
    return result


def _load(path: str) -> InputResult:
    if os.path.isdir(path):
        return InputResult(path, "unknown", False,
                           "a directory with no *.pt.trace.json[.gz], snapshot or census in it")
    try:
        head, gz = _head(path)
    except FileNotFoundError:
        return InputResult(path, "unknown", False, "no such file")
    except PermissionError:
        return InputResult(path, "unknown", False, "permission denied")
    except IsADirectoryError:
        return InputResult(path, "unknown", False, "is a directory")
    except (OSError, TraceFormatError) as exc:
        return InputResult(path, "unknown", False, str(exc))
    if not head.strip():
        return InputResult(path, "unknown", False, "the file is empty")
    if looks_like_pickle(head):
        return _load_snapshot(path, gz)
    stripped = head.lstrip()
    if stripped[:1] not in (b"{", b"["):
        # Old pickle protocols have no header: the restricted unpickler is safe to try.
        attempt = _load_snapshot(path, gz)
        if attempt.ok or "refused to load" in (attempt.error or ""):
            return attempt
        return InputResult(path, "unknown", False,
                           "not a Chrome trace, memory snapshot pickle or tensor census "
                           f"(starts with {head[:16]!r})")
    if b'"flight_profiler.census"' in head:
        try:
            data = parse_census(_read_all(path, gz).decode("utf-8"))
        except (CensusFormatError, UnicodeDecodeError, TraceFormatError) as exc:
            return InputResult(path, "census", False, f"bad tensor census: {exc}")
        return InputResult(path, "census", True, data=data)
    if b'"flight_profiler.grads"' in head:
        try:
            grads = parse_grads(_read_all(path, gz).decode("utf-8"))
        except (GradsFormatError, UnicodeDecodeError, TraceFormatError) as exc:
            return InputResult(path, "grads", False, f"bad gradient-health document: {exc}")
        return InputResult(path, "grads", True, data=grads)
    try:
        raw = load_trace(path)
    except TraceFormatError as exc:
        return InputResult(path, "trace", False, f"bad Chrome trace: {exc}")
    except RecursionError:
        return InputResult(path, "trace", False, "bad Chrome trace: nested too deeply")
    if raw.events == 0:
        return InputResult(path, "trace", False,
                           "a Chrome trace with no events: the profiler recorded nothing")
    metrics = trace_metrics(raw)
    rank = _rank(raw.meta)
    metrics["trace_name"] = raw.meta.get("traceName")
    metrics["device_properties"] = _devices(raw.meta)
    return InputResult(path, "trace", True, data=metrics, rank=rank)


def _rank(meta: dict[str, Any]) -> int | None:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), (int, float)):
        return int(info["rank"])
    return None


def _devices(meta: dict[str, Any]) -> list[dict[str, Any]]:
    props = meta.get("deviceProperties")
    if not isinstance(props, list):
        return []
    return [{"id": p.get("id"), "name": p.get("name"), "total_memory": p.get("totalGlobalMem")}
            for p in props if isinstance(p, dict)]


def _load_snapshot(path: str, gz: bool) -> InputResult:
    try:
        data = _read_all(path, gz)
        parsed = parse_snapshot(data, path, os.path.getmtime(path))
    except UnsafePickle as exc:
        return InputResult(path, "snapshot", False, f"unsafe pickle, not loaded: {exc}")
    except SnapshotFormatError as exc:
        return InputResult(path, "snapshot", False, str(exc))
    except TraceFormatError as exc:
        return InputResult(path, "snapshot", False, str(exc))
    except (pickle.UnpicklingError, EOFError) as exc:
        return InputResult(path, "snapshot", False,
                           f"corrupt or truncated pickle: {exc or 'ran out of input'}")
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError) as exc:
        return InputResult(path, "snapshot", False, f"corrupt pickle: {type(exc).__name__}: {exc}")
    return InputResult(path, "snapshot", True, data=parsed)
