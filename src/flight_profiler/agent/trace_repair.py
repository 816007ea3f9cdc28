"""Mend the one way torch's Chrome trace export is seen to break JSON: a name written unescaped.

torch's exporter writes each member of an event on its own line and a Python frame's name as
it is. With ``with_stack`` over a training loop whose optimizer had imported torch._dynamo
(torch 2.13), one frame's function name was a lone ``"``, written as::

    "name": "torch/_dynamo/polyfills/struct.py(0): "",

and the whole 90 MB trace was refused by every JSON reader (Python's json, HTA, our report,
our own agent's parse: ``torch profile --duration`` and diagnose's window failed with an
internal error on 2 of 2 runs of a plain CPU training loop).

A line is mended only when it is one string member (``"key": "value",``) whose value is not a
valid JSON string: the value is then escaped as the raw text torch meant. Every other byte is
left as it is, and a file that needs nothing comes out identical. Standard library only: the
agent uses it on the traces it exports, the report on traces it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

# Where a string member may be broken, found at C speed (only these lines are looked at in
# Python): a member's value whose first inner quote is followed by something no closing quote
# is (``"name": "f(0): "",``), a backslash, or a control character a JSON string may not hold
# raw. A name holding ``", `` is not seen (the cheap scan cannot tell it from two members).
_QUOTE_SUSPECT = re.compile(rb'": "[^"\n]*"[^,\s}\]:]')
_BYTE_SUSPECT = re.compile(rb"[\\\x00-\x09\x0b\x0c\x0e-\x1f]")
# Every byte _BYTE_SUSPECT does not look for: ``text.translate(None, _PLAIN_BYTES)`` keeps only
# those it does, in one C pass; most traces hold none, and the regex's scan of a 70 MB trace
# took 0.66 s (the quote pattern's 0.26 s).
_PLAIN_BYTES = bytes(b for b in range(256) if not _BYTE_SUSPECT.match(bytes([b])))
_MEMBER = re.compile(rb'^(\s*"[^"\\\n]*"\s*:\s*)"(.*)"(\s*,?\s*)$', re.DOTALL)
# A line longer than this is not one of torch's member lines (a compact one-line JSON file):
# it passes through unmended, and the streaming mender never holds more than this of a line.
MAX_LINE = 1 << 20


def _mend_line(line: bytes) -> bytes | None:
    member = _MEMBER.match(line)
    if member is None:
        return None
    value = member.group(2)
    try:
        json.loads(b'"' + value + b'"')
        return None
    except ValueError:
        pass
    text = json.dumps(value.decode("utf-8", "replace")).encode()
    return member.group(1) + text + member.group(3)


def mend(text: bytes) -> tuple[bytes, int]:
    """(``text`` with its broken string members escaped, how many lines were mended)."""
    suspects = [_QUOTE_SUSPECT] + ([_BYTE_SUSPECT] if text.translate(None, _PLAIN_BYTES) else [])
    starts = sorted({text.rfind(b"\n", 0, m.start()) + 1
                     for suspect in suspects for m in suspect.finditer(text)})
    if not starts:
        return text, 0
    out: list[bytes] = []
    done = mended = 0
    for start in starts:
        end = text.find(b"\n", start)
        end = len(text) if end < 0 else end
        if end - start > MAX_LINE:
            continue
        fixed = _mend_line(text[start:end])
        if fixed is None:
            continue
        out += (text[done:start], fixed)
        done = end
        mended += 1
    out.append(text[done:])
    return b"".join(out), mended


class Mender:
    """``mend`` over a stream of blocks: whole lines are mended, a line's start is held until its
    end arrives (at most MAX_LINE bytes of it: a longer line passes through as it is, to its
    end)."""

    def __init__(self) -> None:
        self.mended = 0
        self._tail = b""
        self._passing = False  # inside a line longer than MAX_LINE: copied as it is

    def feed(self, block: bytes) -> bytes:
        head = b""
        if self._passing:
            end = block.find(b"\n") + 1
            if end == 0:
                return block
            self._passing = False
            head, block = block[:end], block[end:]
        data = self._tail + block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_LINE:
                self._tail, self._passing = b"", True
                return head + data
            self._tail = data
            return head
        self._tail = data[cut:]
        out, n = mend(data[:cut])
        self.mended += n
        if len(self._tail) > MAX_LINE:
            out, self._tail, self._passing = out + self._tail, b"", True
        return head + out

    def finish(self) -> bytes:
        out, n = mend(self._tail)
        self._tail = b""
        self.mended += n
        return out

    def blocks(self, blocks: Iterable[bytes]) -> Iterator[bytes]:
        for block in blocks:
            out = self.feed(block)
            if out:
                yield out
        last = self.finish()
        if last:
            yield last


class MendingReader:
    """A binary stream's bytes, mended on the way (``read(n)`` only: what a streaming JSON
    reader asks for). ``mended`` counts the lines mended so far."""

    _BLOCK = 1 << 20

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._mender = Mender()
        self._ready = b""
        self._ended = False

    @property
    def mended(self) -> int:
        return self._mender.mended

    def read(self, n: int = -1) -> bytes:
        while not self._ended and (n < 0 or len(self._ready) < n):
            block = self._stream.read(self._BLOCK)
            if block:
                self._ready += self._mender.feed(block)
            else:
                self._ready += self._mender.finish()
                self._ended = True
        if n < 0:
            out, self._ready = self._ready, b""
        else:
            out, self._ready = self._ready[:n], self._ready[n:]
        return out
