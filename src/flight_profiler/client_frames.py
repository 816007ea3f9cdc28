"""Reading the agent's frames on the CLI side: bounded in time and in memory.

The agent lives in a process another user controls and may be a fake, and the CLI often runs as
root, so nothing it sends may hold the CLI: a hello followed by silence, one byte a second, or a
header announcing a frame that never comes; nor make it allocate gigabytes: a frame's size
is capped by its kind (read from its first bytes, before its body is buffered), and what it
would cost once decoded is estimated from its bytes before ``json.loads`` runs.

:class:`FrameReader` keeps a frame's partial state between calls, so that a caller can stop
waiting at its deadline (send a cancel), then go on reading the same frame.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time

from flight_profiler.errors import AgentLost, AgentTimeout, BadAnswer, malformed
from flight_profiler.records import FrozenRecord

TYPE_CHECKING = False  # not typing's: importing typing costs a command ~6 ms (issue 23)
if TYPE_CHECKING:
    from typing import Any

_HEADER = struct.Struct(">I")
_PREFIX = 16  # bytes of a body that name its kind: {"type":"result"
_KINDS = ((b'{"type":"event"', "event"), (b'{"type":"result"', "result"),
          (b'{"type":"error"', "error"))
_MAX_DIGITS = 40
_BASE_COST = 64 << 10  # what one json.loads call allocates whatever the frame  # an integer the agent sends is a count, a size, an id: 20 digits suffice


class AnswerLimits(FrozenRecord):
    """What one frame of the agent's may cost the CLI (docs/commands.md, "Deadlines and limits").

    A frame is classified by its first bytes (the agent's encoder writes ``{"type":...`` first):
    results and errors may be up to ``result_bytes``, events ``event_bytes``, anything else (the
    hello, a frame whose type is not first) ``other_bytes``. ``decoded_bytes`` caps the estimated
    size of the Python objects a frame decodes to (a frame of ``[{},{},...]`` costs ~27 times
    its size). ``frame_seconds``: a frame that has begun must be whole within that time.
    """

    FIELDS = ("result_bytes", "event_bytes", "other_bytes", "decoded_bytes", "frame_seconds")
    result_bytes: int
    event_bytes: int
    other_bytes: int
    decoded_bytes: int
    frame_seconds: float

    def __init__(self, result_bytes: int = 32 << 20, event_bytes: int = 8 << 20,
                 other_bytes: int = 64 << 10, decoded_bytes: int = 256 << 20,
                 frame_seconds: float = 30.0) -> None:
        for name, value in zip(self.FIELDS, (result_bytes, event_bytes, other_bytes,
                                             decoded_bytes, frame_seconds)):
            self._set(name, value)

    def cap(self, kind: str) -> int:
        return {"result": self.result_bytes, "error": self.result_bytes,
                "event": self.event_bytes}.get(kind, self.other_bytes)


LIMITS = AnswerLimits()


class DeadlineReached(Exception):
    """The caller's deadline came; the partial frame is kept (read again to go on)."""


class FrameTooLarge(BadAnswer):
    """A frame beyond its kind's cap; its body was not read, so the connection is out of step."""


class FrameTimeout(AgentTimeout):
    """A frame began but did not end within ``frame_seconds``."""


def decoded_cost(body: bytes | bytearray) -> int:
    """An upper bound of what ``json.loads(body)`` allocates, in bytes, read from the bytes alone.

    Calibrated per shape (bench/bench_answer_memory.py and its notes): the decoded text (one
    byte per character, four when any character is beyond ASCII) and the strings made of it,
    then per container (a list or an object, 56-64 bytes, with its slot), per item or key (a
    float or a key's entry: up to 40) and per string (its header: ~50, two quotes). Counting
    brackets, commas and quotes inside strings too only makes the bound larger. Linear, at the
    speed of ``bytes.count``; measured between 1.06 and 13 times the real cost.
    """
    char = 1 if body.isascii() else 4
    containers = body.count(b"{") + body.count(b"[")
    items = body.count(b",") + body.count(b":")
    return (_BASE_COST + 2 * char * len(body) + 120 * containers + 40 * items
            + 30 * body.count(b'"'))


_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (_MAX_DIGITS + 1))


def _bounded_int(text: str) -> int:
    if len(text) > _MAX_DIGITS:
        raise _Malformed(f"an integer of {len(text)} digits")
    return int(text)


class _Malformed(Exception):
    pass


class FrameReader:
    """Frames from one socket, one at a time, with their partial state kept across deadlines."""

    def __init__(self, sock: socket.socket, limits: AnswerLimits = LIMITS) -> None:
        self.sock = sock
        self.limits = limits
        self._reset()

    def _reset(self) -> None:
        self._header = bytearray()
        self._prefix = bytearray()
        self._body: bytearray | None = None
        self._got = 0
        self._length = 0
        self._started: float | None = None  # when the frame's first byte came (monotonic)

    @property
    def in_frame(self) -> bool:
        return self._started is not None

    def read(self, deadline: float | None, cap: int | None = None) -> dict[str, Any] | None:
        """The next message (a JSON object), or None at a clean end of the stream.

        ``deadline`` (monotonic): raise :class:`DeadlineReached` then, keeping the partial frame.
        ``cap``: the most bytes this frame may have whatever its kind (the handshake's hello).
        Raises :class:`FrameTimeout`, :class:`FrameTooLarge`, AgentLost (connection broken or
        cut mid-frame) and BadAnswer (not JSON, not an object, too costly to decode).
        """
        while True:
            if self._body is not None and self._got == self._length:
                body, self._body = self._body, None
                self._reset()
                return self._decode(body)
            chunk = self._recv(deadline)
            if chunk is None:
                return None
            self._take(chunk, cap)

    def _recv(self, deadline: float | None) -> bytes | None:
        """Some bytes of the stream (not more than the current frame needs)."""
        while True:
            frame_end = None if self._started is None else self._started + self.limits.frame_seconds
            until = min((d for d in (deadline, frame_end) if d is not None), default=None)
            if until is not None:
                left = until - time.monotonic()
                if left <= 0:
                    if frame_end is not None and until == frame_end:
                        raise self._frame_timeout()
                    raise DeadlineReached
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(self._wanted())
                break
            except socket.timeout:
                continue  # the loop says which deadline came
            except OSError as exc:
                raise AgentLost(f"lost the connection to the agent: {exc}") from None
        if not chunk:
            if self._started is None:
                return None
            raise AgentLost("the agent closed the connection in the middle of a frame")
        if self._started is None:
            self._started = time.monotonic()
        return chunk

    def _wanted(self) -> int:
        if len(self._header) < _HEADER.size:
            return _HEADER.size - len(self._header)
        if self._body is None:
            return min(self._length, _PREFIX) - len(self._prefix)
        return min(self._length - self._got, 1 << 20)

    def _take(self, chunk: bytes, cap: int | None) -> None:
        if len(self._header) < _HEADER.size:
            self._header += chunk
            if len(self._header) == _HEADER.size:
                (self._length,) = _HEADER.unpack(self._header)
                if self._length > self.limits.result_bytes:
                    raise self._too_large("a frame", self.limits.result_bytes)
                if self._length == 0:
                    self._start_body(cap)
            return
        if self._body is None:
            self._prefix += chunk
            if len(self._prefix) == min(self._length, _PREFIX):
                self._start_body(cap)
            return
        self._body[self._got:self._got + len(chunk)] = chunk
        self._got += len(chunk)

    def _start_body(self, cap: int | None) -> None:
        """The frame's kind is known from its first bytes: check its size, then buffer it."""
        kind = next((name for prefix, name in _KINDS if self._prefix.startswith(prefix)), "other")
        limit = self.limits.cap(kind) if cap is None else min(cap, self.limits.cap(kind))
        if self._length > limit:
            raise self._too_large(f"a frame of kind {kind}", limit)
        self._body = bytearray(self._length)
        self._body[:len(self._prefix)] = self._prefix
        self._got = len(self._prefix)

    def _too_large(self, what: str, limit: int) -> FrameTooLarge:
        return FrameTooLarge(f"the agent's answer was too large: {what} of {self._length:,} bytes "
                             f"(the CLI accepts up to {limit:,})",
                             "ask for less (e.g. `stack --limit 20`), or check what answers at "
                             "the agent's socket")

    def _frame_timeout(self) -> FrameTimeout:
        got = self._got if self._body is not None else len(self._prefix)  # bytes of its body
        total = f" of {self._length:,}" if len(self._header) == _HEADER.size else ""
        return FrameTimeout(f"the agent began an answer but sent only {got:,}{total} bytes of it "
                            f"in {self.limits.frame_seconds:g}s")

    def _decode(self, body: bytearray) -> dict[str, Any]:
        cost = decoded_cost(body)
        if cost > self.limits.decoded_bytes:
            raise BadAnswer(f"the agent's answer was too large: a frame of {len(body):,} bytes "
                            f"would take about {cost >> 20:,} MiB once decoded (the CLI accepts "
                            f"up to {self.limits.decoded_bytes >> 20:,} MiB)",
                            "ask for less (e.g. `stack --limit 20`)")
        try:
            # Only a frame with a long run of digits somewhere (perhaps inside a string) pays
            # for checking each integer: int() of a huge one is quadratic before Python 3.11.
            hook = _bounded_int if _LONG_DIGITS.search(body) else None
            message = json.loads(body, parse_int=hook)
        except _Malformed as exc:
            raise malformed(str(exc)) from None
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise malformed(f"a frame that is not JSON ({type(exc).__name__})") from None
        if not isinstance(message, dict):
            raise malformed("a frame that is not a JSON object")
        return message
