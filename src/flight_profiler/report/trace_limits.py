"""What one trace may cost: caps on its decompressed size and its events, and the top-level
values (``traceName``, ``distributedInfo``, ``deviceProperties``) reduced to the types the report
reads.

Past a cap, ``TraceTooLarge`` says which cap and the variable that raises it, in one line:
``FP_REPORT_MAX_TRACE_MB`` (default 4096 MB of JSON once decompressed) and
``FP_REPORT_MAX_EVENTS`` (default 20 M events). 1.09 M real GPU events are 297 MB of JSON, so the
defaults allow ~15 M events (the columns kept cost ~35 bytes an event); they keep a gzip bomb (a
few MB of .gz that inflates to GBs) from being decompressed and scanned without end.
"""

from __future__ import annotations

import os
from typing import IO, Any

from flight_profiler.report.jsonstream import TraceFormatError

DEFAULT_MAX_TRACE_MB = 4096
DEFAULT_MAX_EVENTS = 20_000_000
# Devices kept per trace (GPU ids, [memory] series): one process drives at most a node's GPUs.
MAX_DEVICES = 64


def max_trace_bytes() -> int:
    """Decompressed bytes a trace may have ($FP_REPORT_MAX_TRACE_MB, in MB)."""
    v = os.environ.get("FP_REPORT_MAX_TRACE_MB", "")
    return (int(v) if v.isdigit() and int(v) > 0 else DEFAULT_MAX_TRACE_MB) << 20


def max_events() -> int:
    """Events a trace may have ($FP_REPORT_MAX_EVENTS)."""
    v = os.environ.get("FP_REPORT_MAX_EVENTS", "")
    return int(v) if v.isdigit() and int(v) > 0 else DEFAULT_MAX_EVENTS


class TraceTooLarge(TraceFormatError):
    """Past one of the caps on a trace: refused before it costs more time or memory."""


class Capped:
    """``read`` of a (decompressed) stream that raises TraceTooLarge past ``limit`` bytes."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self._stream = stream
        self._left = limit

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n if 0 <= n <= self._left else self._left + 1)
        self._left -= len(data)
        if self._left < 0:
            raise TraceTooLarge(
                f"more than {(max_trace_bytes() >> 20):,} MB of JSON once decompressed: not read, to "
                "bound time and memory (FP_REPORT_MAX_TRACE_MB=N raises the limit)")
        return data


def _small_int(v: Any, low: int, high: int) -> int | None:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if type(v) is int and low <= v < high else None


def _short_str(v: Any, limit: int = 1000) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def clean_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The top-level values the report reads, each of the type it expects (else absent): they
    reach the rules and the output as they are, so a list for a rank or a 1 000-deep name
    must not."""
    out: dict[str, Any] = {}
    name = _short_str(meta.get("traceName"))
    if name is not None:
        out["traceName"] = name
    info = meta.get("distributedInfo")
    if isinstance(info, dict):
        out["distributedInfo"] = {k: v for k, v in (
            ("rank", _small_int(info.get("rank"), 0, 1 << 31)),
            ("world_size", _small_int(info.get("world_size"), 1, 1 << 31)),
            ("backend", _short_str(info.get("backend"), 100))) if v is not None}
    props = meta.get("deviceProperties")
    if isinstance(props, list):
        out["deviceProperties"] = [
            {"id": _small_int(p.get("id"), 0, 1 << 31), "name": _short_str(p.get("name"), 200),
             "totalGlobalMem": _small_int(p.get("totalGlobalMem"), 0, 1 << 62)}
            for p in props[:MAX_DEVICES] if isinstance(p, dict)]
    return out
