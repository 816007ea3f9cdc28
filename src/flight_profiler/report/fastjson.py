"""Decode a Chrome trace's events in batches of typed structs, with msgspec, in bounded memory.

Only the fields an analysis reads are decoded (``Event`` / ``Args``); msgspec skips the rest
(input shapes, external ids, flow ids ...) in C. The ``traceEvents`` array is cut into batches
of whole events: a cut is taken at the last ``}`` ``,`` ``{`` of a byte window, and msgspec
decoding ``[`` + batch + ``]`` proves it: a cut inside a string or a nested object leaves the
batch unbalanced, which no JSON decoder accepts. Memory is one window plus one batch of structs.

Anything unusual (the bare-array form, a value larger than the window cap, a field of an
unexpected shape, invalid JSON) raises :class:`NeedStdlib`: the caller then reads the file
again with the stdlib streaming decoder (jsonstream), which is slower, tolerant, and words the
error precisely.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import IO, Any, Callable, Optional

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; the stdlib path still works
    msgspec = None  # type: ignore[assignment]

from flight_profiler.report.jsonstream import MAX_META_CHARS, MAX_VALUE_CHARS

# 2 MB: a batch's structs stay under ~70 MB even for hostile minimal events ("{}," is 3 bytes
# of JSON and ~100 bytes of struct); larger windows were only ~10 % faster (8 MB: 124 MB peak).
WINDOW = 2 << 20
_CUT = re.compile(rb"\}\s*,\s*\{")
_END = re.compile(rb"\}\s*\]")
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_NEXT = re.compile(rb"\s*,\s*\{")
AVAILABLE = msgspec is not None
BOM = b"\xef\xbb\xbf"


class NeedStdlib(Exception):
    """The fast path cannot read this file; read it with the stdlib decoder instead."""


if msgspec is not None:

    class Args(msgspec.Struct, gc=False):
        stream: Any = None
        correlation: Any = None
        device: Any = None
        bytes: Any = None
        device_type: Any = msgspec.field(default=None, name="Device Type")
        device_id: Any = msgspec.field(default=None, name="Device Id")
        total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
        total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
        nbytes: Any = msgspec.field(default=None, name="Bytes")
        addr: Any = msgspec.field(default=None, name="Addr")
        # autograd: a forward op that recorded a graph node has a sequence number; backward
        # functions carry the forward thread's id as well
        seq: Any = msgspec.field(default=None, name="Sequence number")
        fwd_tid: Any = msgspec.field(default=None, name="Fwd thread id")

    class Event(msgspec.Struct, gc=False):
        # Typed fields decode faster than Any (no dispatch on the value); a value of another
        # type (a number for a name, a string for a time) sends the file to the stdlib path.
        ph: str = ""
        cat: str = ""
        name: str = ""
        pid: Any = None
        tid: Any = None
        ts: float = math.nan
        dur: float = 0.0
        # Optional[], not "X | None": msgspec evaluates these at runtime, on Python 3.9 too.
        args: Optional[Args] = None  # noqa: UP045

    _batch = msgspec.json.Decoder(list[Event])
    _meta = msgspec.json.Decoder(dict[str, Any])
    DecodeError: type[Exception] = msgspec.DecodeError
else:  # pragma: no cover - the same shapes as plain classes, for the stdlib path
    class _Plain:
        _fields: tuple[str, ...] = ()

        def __init__(self, **kw: Any) -> None:
            for f in self._fields:
                setattr(self, f, kw.get(f, "" if f == "name" else None))

    class Args(_Plain):  # type: ignore[no-redef]
        _fields = ("stream", "correlation", "device", "bytes", "device_type", "device_id",
                   "total_allocated", "total_reserved", "nbytes", "addr", "seq", "fwd_tid")

    class Event(_Plain):  # type: ignore[no-redef]
        _fields = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")

    DecodeError = ValueError


def _decode(decoder: Any, data: bytes | memoryview) -> Any:
    """``decoder.decode(data)``; invalid UTF-8 (a mangled name) is read as U+FFFD, as the
    stdlib path reads it, instead of ending the report."""
    try:
        return decoder.decode(data)
    except UnicodeDecodeError:
        return decoder.decode(bytes(data).decode("utf-8", "replace").encode("utf-8"))


def _decode_batch(data: bytes | memoryview) -> list[Event]:
    try:
        return _decode(_batch, data)  # type: ignore[no-any-return]
    except (DecodeError, RecursionError) as exc:
        raise NeedStdlib(str(exc)) from None


def _meta_items(text: bytes, on_meta: Callable[[str, Any], None] | None) -> None:
    """Decode ``{...}`` of top-level keys other than traceEvents; refuse anything odd."""
    try:
        obj = _decode(_meta, text)
    except (DecodeError, RecursionError) as exc:
        raise NeedStdlib(str(exc)) from None
    if on_meta is None:
        return
    for k, v in obj.items():
        if len(msgspec.json.encode(v)) <= MAX_META_CHARS:
            on_meta(k, v)


def iter_batches(stream: IO[bytes], on_meta: Callable[[str, Any], None] | None = None,
                 ) -> Iterator[list[Event]]:
    """Yield the events of ``traceEvents`` in batches; raise NeedStdlib when it cannot."""
    if msgspec is None:
        raise NeedStdlib("msgspec is not installed")
    start = stream.read(WINDOW)
    if start.startswith(BOM):  # some editors and Windows tools write one; JSON readers skip it
        start = start[len(BOM):]
    # The header: everything before the traceEvents array, decoded as an object of its own.
    while True:
        m = _KEY.search(start)
        if m is not None:
            break
        if len(start) > MAX_META_CHARS:  # no events key near the start: not the usual layout
            raise NeedStdlib("traceEvents is not near the start")
        more = stream.read(WINDOW)
        if not more:
            raise NeedStdlib("no traceEvents array")
        start += more
    head = start[: m.start()].strip()
    if not head.startswith(b"{"):
        raise NeedStdlib("not an object")
    head = head[1:].strip()
    if head:
        if not head.endswith(b","):
            raise NeedStdlib("malformed header")
        _meta_items(b"{" + head[:-1] + b"}", on_meta)
    # Invariant: buf[0] is a spare byte (it becomes the "[" of a batch), buf[1:] the events.
    buf = bytearray(b" ")
    buf += start[m.end():].lstrip()
    del start
    eof = False
    while True:
        c = buf[1:2]
        if c == b"]":  # an empty array
            _tail(bytes(buf[2:]) + _read_rest(stream), on_meta)
            return
        if c == b"{":
            cuts = _cuts(buf)
            # The array ends after the window's last "},{" (or there is none): "}]" before it
            # are inside events.
            found = _array_end(buf, cuts[-1] if cuts else 1)
            if found is None and cuts:
                found = _batch_at_a_cut(buf, cuts)
                if found is None:
                    # The "},{" were all after the array (a list of objects among the keys that
                    # follow it): the end is further back, or the file is malformed.
                    found = _array_end(buf, 1)
                    if found is None:
                        raise NeedStdlib("no batch of whole events decodes")
                else:
                    cut, batch = found
                    yield batch
                    j = _NEXT.match(buf, cut)
                    if j is None:
                        raise NeedStdlib("no event after a separator")
                    nxt = bytearray(b" ")
                    nxt += memoryview(buf)[j.end() - 1 :]
                    buf = nxt
                    if not eof:
                        more = stream.read(WINDOW)
                        if more:
                            buf += more
                        else:
                            eof = True
                    continue
            if found is not None:
                end, events = found
                yield events
                _tail(bytes(buf[end:]).lstrip()[1:] + _read_rest(stream), on_meta)
                return
        elif c and not c.isspace():
            raise NeedStdlib("an event is not an object")
        if eof:
            raise NeedStdlib("the events array does not end")
        if len(buf) > MAX_VALUE_CHARS:
            raise NeedStdlib("one event larger than the window cap")
        more = stream.read(WINDOW)
        if more:
            buf += more
            if buf[1:2].isspace():
                del buf[1 : len(buf) - len(bytes(buf[1:]).lstrip())]
        else:
            eof = True


def _read_rest(stream: IO[bytes]) -> bytes:
    rest = stream.read(MAX_META_CHARS * 4)
    if stream.read(1):
        raise NeedStdlib("large data after the events")
    return rest


def _cuts(buf: bytearray) -> list[int]:
    """Offsets just after each ``}`` followed by ``,`` and ``{`` near the window's end."""
    start = max(1, len(buf) - (1 << 20))
    while True:
        found = [m.start() + 1 for m in _CUT.finditer(buf, start)]
        if found or start == 1:
            return found
        start = max(1, start - (4 << 20))


def _batch_at_a_cut(buf: bytearray, cuts: list[int], tries: int = 8,
                    ) -> tuple[int, list[Event]] | None:
    """Decode the events up to the last cut that ends a batch of whole events.

    In place: the spare byte becomes "[", the byte after the cut (a space or the ",") "]", so
    the window is not copied. Earlier cuts are tried when the last ones fall after the array.
    """
    buf[0] = 0x5B
    for cut in reversed(cuts[-tries:]):
        keep = buf[cut]
        buf[cut] = 0x5D
        try:
            return cut, _decode(_batch, memoryview(buf)[: cut + 1])
        except (DecodeError, RecursionError):
            continue
        finally:
            buf[cut] = keep
    return None


def _array_end(buf: bytearray, start: int, attempts: int = 8,
               ) -> tuple[int, list[Event]] | None:
    """Where the events array ends in the window (just after its last event), if it does.

    ``}`` ``]`` also occurs inside an event (a list of objects in its args): a candidate is the
    end only if everything before it decodes as whole events.
    """
    for m in _END.finditer(buf, start):
        if attempts == 0:
            raise NeedStdlib("too many candidate ends of the events array")
        attempts -= 1
        end = m.start() + 1
        try:
            return end, _decode(_batch, b"[" + buf[1:end] + b"]")
        except (DecodeError, RecursionError):
            continue
    return None


def _tail(rest: bytes, on_meta: Callable[[str, Any], None] | None) -> None:
    """After the array: ``}`` or ``, "key": value ... }``."""
    rest = rest.strip()
    if rest == b"}":
        return
    if not rest.startswith(b","):
        raise NeedStdlib("malformed end of file")
    _meta_items(b"{" + rest[1:], on_meta)
