"""Find the inputs (files, TensorBoard profiler directories) and read each by its content.

Detection never trusts the extension: gzip is recognised by its magic bytes, pickles by their
protocol header, a census by its ``format`` key, anything else JSON is streamed as a trace.
One unreadable file becomes an ``InputResult(ok=False, error=...)``; the others go on.
"""

from __future__ import annotations

import io
import os
import pickle
import time
import zlib
from typing import Any

from flight_profiler.report.arm_events import ArmEventFormatError, parse_event
from flight_profiler.report.census import CensusFormatError, parse_census
from flight_profiler.report.grads import GradsFormatError, parse_grads
from flight_profiler.report.job_metrics import job_metrics
from flight_profiler.report.jsonstream import (
    NotRegularFile,
    TraceFormatError,
    open_regular,
    open_text_bytes,
)
from flight_profiler.report.models import InputResult
from flight_profiler.report.rank_stacks import StacksFormatError, parse_stacks
from flight_profiler.report.safe_pickle import (
    TooLarge,
    UnsafePickle,
    address_space_cap,
    limited,
    looks_like_pickle,
)
from flight_profiler.report.snapshot import SnapshotFormatError, parse_snapshot
from flight_profiler.report.trace_limits import TraceTooLarge
from flight_profiler.report.trace_loader import load_trace
from flight_profiler.report.trace_metrics import trace_metrics
from flight_profiler.report.walk import walk_inputs

MAX_SNIFF = 64 * 1024
OWN_OUTPUT = "own-output"  # kind of a diagnose.json / report.json: skipped inside directories
BOM = b"\xef\xbb\xbf"
# Bounds on what is read whole (decompressed bytes): a census is a few MB at most; a snapshot
# pickle of a big job tens of MB. Above them a file is refused, not read until memory runs out.
MAX_CENSUS_BYTES = 16 << 20
MAX_PICKLE_BYTES = int(os.environ.get("FP_REPORT_MAX_PICKLE_MB", "128") or 128) << 20
PICKLE_BASE_BUDGET = 200 << 20


def expand(paths: list[str], notes: list[InputResult] | None = None,
           walked: set[str] | None = None) -> list[str]:
    """Files as given; a directory becomes the traces under it (TensorBoard layout:
    ``plugins/profile/<run>/*.pt.trace.json[.gz]``), plus the pickles and JSON files beside them.

    A walk that stops at one of its caps adds a note (an unread ``InputResult`` naming the cap)
    to ``notes``; the files found in directories are added to ``walked``."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            found, stopped = walk_inputs(p)
            found = sorted(_without_arm_extras(set(found)))
            out.extend(found if found else [p])
            if walked is not None:
                walked.update(found)
            if stopped and notes is not None:
                notes.append(InputResult(p, "unknown", False, stopped))
        else:
            out.append(p)
    return _distinct_files(out)


# Files of an `arm` event directory that event.json already reports on (the stack answer,
# torch's Flight Recorder pickle): not inputs of their own.
_ARM_EXTRAS = ("stacks.json", "fr_trace.pickle")


def _without_arm_extras(found: set[str]) -> set[str]:
    return {f for f in found if not (os.path.basename(f) in _ARM_EXTRAS and os.path.exists(
        os.path.join(os.path.dirname(f), "event.json")))}


def _distinct_files(paths: list[str]) -> list[str]:
    """One path per file: a directory may hold hard links to the same trace (diagnose
    --all-ranks' HTA directory), which must not count twice."""
    seen: set[tuple[int, int]] = set()
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append(p)  # reported as unreadable by load_one
            continue
        key = (st.st_dev, st.st_ino)
        if key not in seen or os.path.isdir(p):
            seen.add(key)
            out.append(p)
    return out


def _head(path: str) -> tuple[bytes, bool]:
    with open_text_bytes(path) as fh:
        gz = not isinstance(fh, io.BufferedReader)
        try:
            return fh.read(MAX_SNIFF), gz
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"corrupt gzip data: {exc}") from None


def _text(data: bytes) -> str:
    """JSON text: a leading BOM skipped, invalid UTF-8 read as U+FFFD (as in traces)."""
    return data.decode("utf-8-sig", "replace")


def _read_all(path: str, limit: int, what: str) -> bytes:
    """The whole (decompressed) content, refused beyond ``limit`` bytes."""
    with open_text_bytes(path) as fh:
        try:
            data = fh.read(limit + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"corrupt or truncated gzip data: {exc}") from None
    if len(data) > limit:
        raise TraceFormatError(f"larger than {limit >> 20} MB (decompressed): not a {what}")
    return data


def load_one(path: str) -> InputResult:
    """Read one input; every failure becomes ``ok=False`` with a one-line reason."""
    t0 = time.perf_counter()
    try:
        result = _load(path)
    except MemoryError:
        result = InputResult(path, "unknown", False, "ran out of memory reading it")
    except RecursionError:
        result = InputResult(path, "unknown", False, "nested too deeply to be a profiler artefact")
    except Exception as exc:  # a hostile file must never end the whole report
        result = InputResult(path, "unknown", False,
                             f"unreadable ({type(exc).__name__}: {exc}); please report this file")
    if result.error:
        result.error = _one_line(result.error)
    result.elapsed_s = time.perf_counter() - t0
    return result


def _one_line(text: str, limit: int = 300) -> str:
    flat = "".join(c if c.isprintable() else " " for c in text)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _load(path: str) -> InputResult:
    if os.path.isdir(path):
        return InputResult(path, "unknown", False,
                           "a directory with no *.pt.trace.json[.gz], snapshot or census in it")
    try:
        head, _gz = _head(path)
    except FileNotFoundError:
        return InputResult(path, "unknown", False, "no such file")
    except PermissionError:
        return InputResult(path, "unknown", False, "permission denied")
    except IsADirectoryError:
        return InputResult(path, "unknown", False, "is a directory")
    except NotRegularFile as exc:
        return InputResult(path, "unknown", False, str(exc))
    except OSError as exc:
        return InputResult(path, "unknown", False, exc.strerror or str(exc))
    except TraceFormatError as exc:
        return InputResult(path, "unknown", False, str(exc))
    if not head.strip():
        return InputResult(path, "unknown", False, "the file is empty")
    if looks_like_pickle(head):
        return _load_snapshot(path)
    head = head[len(BOM):] if head.startswith(BOM) else head
    stripped = head.lstrip()
    if stripped[:1] not in (b"{", b"["):
        # Old pickle protocols have no header: the restricted unpickler is safe to try.
        attempt = _load_snapshot(path)
        if attempt.ok or "refused to load" in (attempt.error or ""):
            return attempt
        return InputResult(path, "unknown", False,
                           "not a Chrome trace, memory snapshot pickle or tensor census "
                           f"(starts with {head[:16]!r})")
    if b'"flight_profiler.diagnose"' in head or b'"flight_profiler.diagnose_job"' in head or (b'"schema_version"' in head and b'"tool"' in head
                                                and b'"flight_profiler"' in head):
        # diagnose.json, diagnose_job.json, report.json: what diagnose and report write, beside
        # their inputs.
        return InputResult(path, OWN_OUTPUT, False, "written by flight_profiler diagnose/report, "
                           "not an input: pass the traces, snapshots and censuses beside it")
    if b'"flight_profiler.census"' in head:
        try:
            text = _text(_read_all(path, MAX_CENSUS_BYTES, "tensor census"))
            # Real censuses (strings and numbers) take a few times their size once parsed.
            with address_space_cap((64 << 20) + 8 * len(text)):
                data = parse_census(text)
        except (CensusFormatError, TraceFormatError) as exc:
            return InputResult(path, "census", False, f"bad tensor census: {exc}")
        except MemoryError:
            return InputResult(path, "census", False,
                               "bad tensor census: needs far more memory than its size")
        return InputResult(path, "census", True, data=data)
    if b'"flight_profiler.arm_event"' in head:
        try:
            event = parse_event(_read_all(path, MAX_CENSUS_BYTES, "arm event").decode("utf-8"), path)
        except (ArmEventFormatError, UnicodeDecodeError, TraceFormatError) as exc:
            return InputResult(path, "arm_event", False, f"bad arm event: {exc}")
        return InputResult(path, "arm_event", True, data=event, rank=event.get("rank"))
    if b'"flight_profiler.rank_stacks"' in head:
        return _load_stacks(path)
    if b'"flight_profiler.grads"' in head:
        try:
            grads = parse_grads(_text(_read_all(path, MAX_CENSUS_BYTES, "gradient-health document")))
        except (GradsFormatError, TraceFormatError) as exc:
            return InputResult(path, "grads", False, f"bad gradient-health document: {exc}")
        return InputResult(path, "grads", True, data=grads)
    try:
        raw = load_trace(path)
    except TraceTooLarge as exc:
        return InputResult(path, "trace", False, f"a Chrome trace of {exc}")
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
    metrics["distributed"] = job_metrics(raw)
    return InputResult(path, "trace", True, data=metrics, rank=rank)


def _load_stacks(path: str) -> InputResult:
    try:
        data = parse_stacks(_text(_read_all(path, MAX_CENSUS_BYTES, "rank stacks file")))
    except (StacksFormatError, TraceFormatError) as exc:
        return InputResult(path, "stacks", False, f"bad rank stacks file: {exc}")
    return InputResult(path, "stacks", True, data=data, rank=data["rank"])


def _rank(meta: dict[str, Any]) -> int | None:
    info = meta.get("distributedInfo")  # checked by clean_meta: an int or absent
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) else None


def _devices(meta: dict[str, Any]) -> list[dict[str, Any]]:
    props = meta.get("deviceProperties")
    if not isinstance(props, list):
        return []
    return [{"id": p.get("id"), "name": p.get("name"), "total_memory": p.get("totalGlobalMem")}
            for p in props if isinstance(p, dict)]


def _pickle_budget(path: str) -> int:
    """Address space a snapshot may take while unpickled: real ones need about 10x their
    (decompressed) size; gzip shrinks them about 5x."""
    size = os.path.getsize(path)
    with open_regular(path) as fh:
        if fh.read(2) == b"\x1f\x8b":
            size *= 5
    override = os.environ.get("FP_REPORT_PICKLE_MEMORY_MB")
    if override and override.isdigit():
        return int(override) << 20
    return PICKLE_BASE_BUDGET + 12 * min(size, MAX_PICKLE_BYTES)


def _load_snapshot(path: str) -> InputResult:
    try:
        with open_text_bytes(path) as fh:
            parsed = parse_snapshot(limited(fh, MAX_PICKLE_BYTES), path, os.path.getmtime(path),
                                    _pickle_budget(path))
    except MemoryError:
        return InputResult(path, "snapshot", False,
                           "needs more memory to unpickle than a snapshot of its size would: "
                           "refused (set FP_REPORT_PICKLE_MEMORY_MB=N if it is a real snapshot)")
    except TooLarge:
        return InputResult(path, "snapshot", False,
                           f"larger than {MAX_PICKLE_BYTES >> 20} MB (decompressed): refused to "
                           "bound memory; raise FP_REPORT_MAX_PICKLE_MB to read it")
    except UnsafePickle as exc:
        return InputResult(path, "snapshot", False, f"unsafe pickle, not loaded: {exc}")
    except SnapshotFormatError as exc:
        return InputResult(path, "snapshot", False, str(exc))
    except TraceFormatError as exc:
        return InputResult(path, "snapshot", False, str(exc))
    except (OSError, zlib.error) as exc:
        return InputResult(path, "snapshot", False, f"corrupt or truncated gzip data: {exc}")
    except (pickle.UnpicklingError, EOFError) as exc:
        return InputResult(path, "snapshot", False,
                           f"corrupt or truncated pickle: {exc or 'ran out of input'}")
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as exc:
        return InputResult(path, "snapshot", False, f"corrupt pickle: {type(exc).__name__}: {exc}")
    return InputResult(path, "snapshot", True, data=parsed)
