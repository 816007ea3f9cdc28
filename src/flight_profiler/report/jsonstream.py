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
from collections.abc import Iterator
from typing import IO, Any, Callable

CHUNK = 1 << 20
_WS = " \t\r\n"


class TraceFormatError(ValueError):
    """The file is not a well-formed Chrome trace (truncated, corrupt or another format)."""


def open_text_bytes(path: str) -> IO[bytes]:
    """Open ``path`` for binary reading, transparently gunzipping ``.gz`` files (by magic)."""
    raw = open(path, "rb")  # noqa: SIM115 - handed to the caller, who closes it
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


class _Buffer:
    """A text window over a byte stream, refilled on demand."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
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
        try:
            chunk = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise TraceFormatError(f"not UTF-8 text near byte {exc.start}") from exc
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
            n = len(text)
            while pos < n and text[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < n:
                return text[pos]
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
                if self.more():
                    continue
                raise TraceFormatError(
                    f"invalid JSON at character {self.consumed + exc.pos}: {exc.msg}"
                    + (" (the file looks truncated)" if exc.pos >= len(self.text) - 1 else "")
                ) from None
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
                val = buf.value(decode)
                if on_meta is not None:
                    on_meta(key, val)
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
        except json.JSONDecodeError:
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
