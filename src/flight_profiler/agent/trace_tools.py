"""Chrome traces from torch.profiler: finish them for the tools users open them in, and
summarise their operators.

``export(profs, path, ...)``: export to a temp file next to ``path``, add ``distributedInfo``
(rank from $RANK, else 0) and ``traceName`` so that Holistic Trace Analysis loads CPU-only
traces too, then write ``path`` atomically (gzip when it ends in .gz). An export bigger than
``PARSE_LIMIT_BYTES`` is not parsed in the target: the keys are spliced in and the bytes copied.
``top_ops(trace)``: self/total CPU time per ``cpu_op`` (self = duration minus direct children
in the same thread) and CUDA time per kernel name, computed from the exported events rather
than ``prof.key_averages()``, which crashed under with_stack once a DataLoader had been
iterated (torch-formats.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO

from .profiler_sessions import release
from .protocol import ERR_FAILED
from .registry import CommandError
from .torch_support import quiet_native_stderr, write_blocks, write_json
from .trace_repair import Mender, mend

SORT_KEYS = ("self_cpu", "cpu_total", "self_cuda", "count")


# Above this size (all sessions' exports together) a trace is not parsed inside the target:
# json.load takes about 10x the file's size in Python objects, in the user's process. It is
# copied, or the sessions joined, as text (metadata spliced in, gzip streamed in blocks), and
# its top operators are left to `report`.
PARSE_LIMIT_BYTES = 48 << 20
_HEAD_BYTES = 1 << 20


def export(profs: list[Any], path: str, trace_name: str, notes: list[str] | None = None,
           parse: bool = True) -> tuple[int, dict[str, Any] | None]:
    """(size written, trace dict) for stopped profiler sessions, merged into one trace; the
    trace dict is None when the exports were too big to parse here, or ``parse`` is False (no
    table wanted): copied and joined as text. A 1.8 s window of a PINN's loop, 36 MB exported,
    took 1.4 s to parse and 3.7 s to write back here; copied, 0.4 s, and no memory in the job.

    Sessions of one process share the trace clock (baseTimeNanoseconds), so their events
    merge as they are; metadata events repeated by each session are kept once (when parsed).
    """
    directory = os.path.dirname(path) or "."
    tmps: list[str] = []
    try:
        while profs:
            prof = profs.pop(0)
            fd, tmp = tempfile.mkstemp(prefix=".fp-trace-", suffix=".json", dir=directory)
            os.close(fd)
            tmps.append(tmp)
            with quiet_native_stderr():
                prof.export_chrome_trace(tmp)
            release(prof)
            del prof  # freed here, in the agent's thread
        mender = Mender()
        try:
            if not parse or sum(os.path.getsize(t) for t in tmps) > PARSE_LIMIT_BYTES:
                copied = (copy_unparsed(tmps[0], path, trace_name, mender) if len(tmps) == 1
                          else join_unparsed(tmps, path, trace_name, mender))
                if copied is not None:
                    return copied, None
            return _parse_and_merge(tmps, path, trace_name, mender)
        finally:
            if mender.mended and notes is not None:
                notes.append(f"torch wrote {mender.mended} event name(s) unescaped into its "
                             "export (invalid JSON): escaped in the written trace")
    finally:
        for tmp in tmps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _load_export(tmp: str, mender: Mender) -> Any:
    """One session's export, parsed; mended first only if torch wrote it as invalid JSON."""
    with open(tmp, "rb") as f:
        data = f.read()
    try:
        return json.loads(data)
    except ValueError:
        pass
    data, mended = mend(data)
    mender.mended += mended
    try:  # a name that is not UTF-8 reads as U+FFFD, as the report reads it
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError as exc:
        raise CommandError(f"torch's export of this session is not valid JSON ({exc})",
                           "nothing was written; try again without --with-stack / --record-shapes, "
                           "and report it to PyTorch with its version", ERR_FAILED) from None


def _parse_and_merge(tmps: list[str], path: str, trace_name: str,
                     mender: Mender) -> tuple[int, dict[str, Any]]:
    merged: dict[str, Any] | None = None
    seen_meta: set[str] = set()
    for tmp in tmps:
        trace = _load_export(tmp, mender)
        if not isinstance(trace, dict):
            trace = {"traceEvents": trace}
        events = []
        for e in trace.get("traceEvents") or []:
            if isinstance(e, dict) and e.get("ph") == "M":
                key = json.dumps(e, sort_keys=True)
                if key in seen_meta:
                    continue
                seen_meta.add(key)
            events.append(e)
        if merged is None:
            merged = trace
            merged["traceEvents"] = events
        else:
            merged["traceEvents"].extend(events)
    if merged is None:
        merged = {"traceEvents": []}
    return finish_trace(merged, path, trace_name), merged


def _opening(head: bytes) -> tuple[bytes, int] | None:
    """What replaces the opening of torch's export (its first ``head`` bytes): ``{`` plus our
    ``distributedInfo`` when torch wrote none, and the offset to copy the rest from; None
    when it does not open like torch's export (an object whose first member is a key)."""
    brace = head.find(b"{")
    if brace < 0 or head[:brace].strip() or head[brace + 1:].lstrip()[:1] != b'"':
        return None
    first = b"{"
    if b'"distributedInfo"' not in head:
        first += b'"distributedInfo": ' + json.dumps({"rank": _rank()}).encode() + b","
    return first, brace + 1


def copy_unparsed(src: str, path: str, trace_name: str, mender: Mender | None = None) -> int | None:
    """Write the exported trace ``src`` to ``path`` without parsing it, copied in blocks, with
    ``distributedInfo`` spliced in after the opening brace when the export has none, and
    ``traceName`` before the closing one (torch writes its own, and the last key wins). None
    when the file does not look like torch's export (then it is parsed instead)."""
    with open(src, "rb") as f:
        head = f.read(_HEAD_BYTES)
        opening = _opening(head)
        if opening is None:
            return None
        first, after = opening
        f.seek(max(0, os.fstat(f.fileno()).st_size - 64))
        if not f.read().rstrip().endswith(b"}"):
            return None
        f.seek(len(head))
        last = b',"traceName": ' + json.dumps(trace_name).encode() + b"}"

        def blocks() -> Iterator[bytes]:
            pending = first + head[after:]
            while True:
                block = f.read(_HEAD_BYTES)
                if not block:
                    break
                if not block.strip():  # trailing blank lines stay with the closing brace
                    pending += block
                    continue
                yield pending
                pending = block
            body = pending.rstrip()
            yield body[:-1] + last  # body ends with the closing brace (checked above)

        return write_blocks(path, (mender or Mender()).blocks(blocks()))


_EVENTS_OPEN = re.compile(rb'"traceEvents"\s*:\s*\[')
_CLOSING = re.compile(rb'\]\s*,\s*"traceName"\s*:\s*"[^"\\]*"\s*\}\s*$')
_TAIL_BYTES = 4096


def _events_span(f: BinaryIO) -> tuple[int, int, bool] | None:
    """(start, end, has_events) of the text inside the traceEvents array of one of torch's
    exports (events last, then ``],"traceName": "..."}``), or None for any other layout."""
    head = f.read(_HEAD_BYTES)
    opened = _EVENTS_OPEN.search(head)
    size = os.fstat(f.fileno()).st_size
    f.seek(max(0, size - _TAIL_BYTES))
    tail_at = f.tell()
    tail = f.read()
    closing = _CLOSING.search(tail)
    if opened is None or closing is None:
        return None
    start, end = opened.end(), tail_at + closing.start()
    if end < start:
        return None
    f.seek(start)
    return start, end, f.read(min(end - start, 4096)).strip()[:1] == b"{"


def _copy_range(f: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    f.seek(start)
    left = end - start
    while left > 0:
        block = f.read(min(_HEAD_BYTES, left))
        if not block:
            return
        left -= len(block)
        yield block


def join_unparsed(srcs: list[str], path: str, trace_name: str, mender: Mender | None = None) -> int | None:
    """Several sessions' exports joined as text into one trace at ``path``: the first one's
    header and events, the others' events, then our ``traceName``. Metadata events repeated by
    each session stay repeated (unparsed, they cannot be told apart). None when an export is
    not in torch's layout."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(src, "rb")) for src in srcs]
        spans = []
        for f in files:
            span = _events_span(f)
            if span is None:
                return None
            spans.append(span)
        f0 = files[0]
        f0.seek(0)
        opening = _opening(f0.read(_HEAD_BYTES))
        if opening is None:
            return None
        first, after = opening

        def blocks() -> Iterator[bytes]:
            yield first
            yield from _copy_range(f0, after, spans[0][0])  # header up to the events
            wrote = False
            for f, (start, end, has_events) in zip(files, spans):
                if not has_events:
                    continue
                if wrote:
                    yield b","
                yield from _copy_range(f, start, end)
                wrote = True
            yield b'],"traceName": ' + json.dumps(trace_name).encode() + b"}"

        return write_blocks(path, (mender or Mender()).blocks(blocks()))


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def finish_trace(trace: dict[str, Any], path: str, trace_name: str) -> int:
    info = trace.get("distributedInfo")
    if not isinstance(info, dict):
        info = trace["distributedInfo"] = {}
    if "rank" not in info:
        info["rank"] = _rank()
    trace["traceName"] = trace_name
    return write_json(path, trace)


def top_ops(trace: dict[str, Any], sort_by: str = "self_cpu", limit: int = 15) -> dict[str, Any]:
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    ops: dict[str, dict[str, float]] = {}
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    kernels = 0
    for e in events:
        cat = e.get("cat")
        if cat == "cpu_op":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif cat == "kernel":
            kernels += 1
            row = ops.setdefault(str(e.get("name")), _row())
            row["self_cuda"] += float(e.get("dur", 0))
            row["cuda_total"] += float(e.get("dur", 0))
            row["kernels"] += 1
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
        stack: list[tuple[float, dict[str, float]]] = []  # (end, row of the open op)
        for e in thread_events:
            ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
            while stack and stack[-1][0] <= ts:
                stack.pop()
            row = ops.setdefault(str(e.get("name")), _row())
            row["count"] += 1
            row["cpu_total"] += dur
            row["self_cpu"] += dur
            if stack:
                stack[-1][1]["self_cpu"] -= dur
            stack.append((ts + dur, row))
    key = sort_by if sort_by in SORT_KEYS else "self_cpu"
    rows: list[dict[str, Any]] = [{"name": name, **{k: round(v, 3) for k, v in row.items()}}
                                  for name, row in ops.items()]
    rows.sort(key=lambda r: -float(r[key]))
    total_self = sum(float(r["self_cpu"]) for r in rows)
    return {"sort_by": key, "rows": rows[:limit], "operators": len(rows),
            "self_cpu_total_us": round(total_self, 3), "has_cuda": kernels > 0,
            "events": len(trace.get("traceEvents", []))}


def _row() -> dict[str, float]:
    return {"count": 0, "self_cpu": 0.0, "cpu_total": 0.0, "self_cuda": 0.0, "cuda_total": 0.0,
            "kernels": 0}
