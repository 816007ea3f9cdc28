"""Stream the events of a Chrome trace without loading the whole document.

A Chrome trace is one JSON object whose ``traceEvents`` array holds up to millions of small
objects. ``json.load`` would build all of them at once (HTA peaks at 1.27 GB on a 1 M-event
trace); here the C scanner behind ``json.JSONDecoder.raw_decode`` decodes one event at a time
from a sliding text buffer, so memory stays at one chunk plus whatever the caller aggregates.

The other top-level keys (``distributedInfo``, ``deviceProperties``, ``traceName`` ...) are
small; they are decoded whole and handed to the caller as they come, before or after the events.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import IO, Any, Callable

CHUNK = 1 << 20
_WS = " \t\r\n"
_NOT_WS = re.compile(r"[^ \t\r\n]")
# No event or top-level value of a real trace comes near this; a hostile file with one huge
# string would otherwise make the window (and each retried decode of it) grow without bound.
MAX_VALUE_CHARS = 32 << 20
# Top-level values other than traceEvents are kept for the caller only when this small, and
# only while those kept total MAX_META_TOTAL_CHARS (a file of many such keys would add up).
MAX_META_CHARS = 1 << 20
MAX_META_TOTAL_CHARS = 4 << 20


class TraceFormatError(ValueError):
    """The file is not a well-formed Chrome trace (truncated, corrupt or another format)."""


class NotRegularFile(OSError):
    """A FIFO, device or socket: reading it could block forever or never end."""


def open_regular(path: str) -> IO[bytes]:
    """Open a regular file for binary reading; refuse FIFOs and devices without blocking.

    O_NONBLOCK makes opening a FIFO with no writer return at once; fstat on the opened
    descriptor (not the name) decides, so the check cannot be raced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise NotRegularFile(f"{kind}, not a regular file: save it to a file first")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_text_bytes(path: str) -> IO[bytes]:
    """Open ``path`` for binary reading, transparently gunzipping ``.gz`` files (by magic)."""
    raw = open_regular(path)
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


class _Buffer:
    """A text window over a byte stream, refilled on demand."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        # utf-8-sig: a leading BOM is skipped; "replace": invalid UTF-8 in a string (a mangled
        # name) reads as U+FFFD instead of refusing a trace for one bad byte.
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")("replace")
        self.text = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front, for error positions

    def more(self) -> bool:
        """Append the next chunk; False at end of input."""
        if self.eof:
            return False
        try:
            data = self._stream.read(CHUNK)
        except (OSError, EOFError) as exc:  # gzip: truncated or corrupt stream
            raise TraceFormatError(f"cannot decompress: {exc}") from exc
        chunk = self._decoder.decode(data, final=not data)
        if not data:
            self.eof = True
        if self.pos > len(self.text) // 2 or self.pos > CHUNK:
            self.consumed += self.pos
            self.text = self.text[self.pos :]
            self.pos = 0
        self.text += chunk
        return bool(data) or bool(chunk)

    def skip_ws(self) -> str:
        """Skip whitespace; return the next character ('' at end of input)."""
        while True:
            text, pos = self.text, self.pos
            if pos < len(text) and text[pos] not in _WS:
                return text[pos]
            m = _NOT_WS.search(text, pos)
            if m is not None:
                self.pos = m.start()
                return text[self.pos]
            self.pos = len(text)
            if not self.more():
                return ""

    def expect(self, chars: str) -> str:
        c = self.skip_ws()
        if c == "" or c not in chars:
            found = "end of file" if c == "" else repr(c)
            raise TraceFormatError(
                f"expected {' or '.join(repr(x) for x in chars)} at character "
                f"{self.consumed + self.pos}, found {found}"
            )
        self.pos += 1
        return c

    def value(self, decode: Callable[[str, int], tuple[Any, int]]) -> Any:
        """Decode one JSON value at the cursor, reading more input while it is incomplete."""
        self.skip_ws()
        while True:
            try:
                obj, end = decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                # Incomplete at the end of the window: read more and retry; else it is corrupt.
                if len(self.text) - self.pos > MAX_VALUE_CHARS:
                    raise TraceFormatError(
                        f"a value at character {self.consumed + self.pos} is larger than "
                        f"{MAX_VALUE_CHARS >> 20} MB: not a profiler trace") from None
                if self.more():
                    continue
                raise TraceFormatError(
                    f"invalid JSON at character {self.consumed + exc.pos}: {exc.msg}"
                    + (" (the file looks truncated)" if exc.pos >= len(self.text) - 1 else "")
                ) from None
            except (ValueError, RecursionError) as exc:
                # int() refuses numbers over 4300 digits; deep nesting exhausts the C stack.
                why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise TraceFormatError(
                    f"invalid JSON at character {self.consumed + self.pos}: {why}") from None
            # A bare number could have been cut by the window edge: make sure it ended.
            if (end >= len(self.text) and not self.eof
                    and not isinstance(obj, (dict, list, str)) and self.more()):
                continue
            self.pos = end
            return obj


def iter_trace(
    stream: IO[bytes], on_meta: Callable[[str, Any], None] | None = None,
    counts: dict[str, int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield each event of ``traceEvents``; call ``on_meta(key, value)`` for other top-level keys.

    Also accepts the bare-array form of the Chrome trace format (``[event, ...]``).
    Flat flow events are skipped undecoded; ``counts["skipped"]`` says how many.
    Raises TraceFormatError on anything that is not a trace.
    """
    buf = _Buffer(stream)
    decode = json.JSONDecoder().raw_decode
    counts = counts if counts is not None else {}
    counts.setdefault("skipped", 0)
    first = buf.skip_ws()
    if first == "":
        raise TraceFormatError("the file is empty")
    if first == "[":
        buf.pos += 1
        yield from _iter_array(buf, decode, counts)
        return
    if first != "{":
        raise TraceFormatError(f"not a JSON object (starts with {first!r})")
    buf.pos += 1
    seen_events = False
    kept = 0
    if buf.skip_ws() == "}":
        buf.pos += 1
    else:
        while True:
            key = buf.value(decode)
            if not isinstance(key, str):
                raise TraceFormatError("expected a key string in the top-level object")
            buf.expect(":")
            if key == "traceEvents":
                buf.expect("[")
                seen_events = True
                yield from _iter_array(buf, decode, counts)
            else:
                start = buf.consumed + buf.pos
                val = buf.value(decode)
                size = buf.consumed + buf.pos - start
                if size > MAX_META_CHARS or kept + size > MAX_META_TOTAL_CHARS:
                    counts["meta_skipped"] = counts.get("meta_skipped", 0) + 1
                elif on_meta is not None:
                    kept += size
                    on_meta(key, val)
                del val
            if buf.expect(",}") == "}":
                break
    if not seen_events:
        raise TraceFormatError("no traceEvents array: not a Chrome trace")


def _iter_array(buf: _Buffer, decode: Callable[[str, int], tuple[Any, int]],
                counts: dict[str, int]) -> Iterator[dict[str, Any]]:
    if buf.skip_ws() == "]":
        buf.pos += 1
        return
    while True:
        # Fast path: decode straight from the window; fall back to the refilling path.
        text, pos = buf.text, buf.pos
        # Flow events ("ph": "s" / "f", a quarter of a GPU trace) are never used: skip them
        # without decoding when they are flat objects, as torch writes them.
        j = text.find('"ph": "', pos, pos + 24)
        if j >= 0 and text[j + 7 : j + 9] in ('s"', 'f"'):
            k = text.find("}", j)
            if k >= 0 and text.find("{", pos + 1, k) < 0:
                buf.pos = k + 1
                counts["skipped"] += 1
                if buf.expect(",]") == "]":
                    return
                buf.skip_ws()
                continue
        try:
            obj, end = decode(text, pos)
        except (ValueError, RecursionError):  # incomplete, or hostile: the slow path decides
            obj = buf.value(decode)
        else:
            if end >= len(text) and not isinstance(obj, dict):
                obj = buf.value(decode)
            else:
                buf.pos = end
        if isinstance(obj, dict):
            yield obj
        # Separator: usually ", " or ",\n  " right here.
        text, pos = buf.text, buf.pos
        if pos < len(text) and text[pos] == ",":
            buf.pos = pos + 1
            c = text[pos + 1] if pos + 1 < len(text) else ""
            if c in _WS or c == "":
                buf.skip_ws()
            continue
        if buf.expect(",]") == "]":
            return
        buf.skip_ws()
