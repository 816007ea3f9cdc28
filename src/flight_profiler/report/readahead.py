"""Decompress ahead in a thread while the caller decodes: gzip then costs max(inflate, decode)
instead of their sum (zlib releases the GIL while it inflates)."""

from __future__ import annotations

import queue
import threading
from typing import IO, Any

_END = b""


class ReadAhead:
    """``read(n)`` over ``stream``, fed by a thread that reads ``chunk`` bytes at a time.

    At most ``depth`` chunks wait decoded in memory. An error in the thread is raised by the
    ``read`` that reaches it. ``close()`` stops the thread; the caller still closes ``stream``.
    """

    def __init__(self, stream: IO[bytes], chunk: int = 8 << 20, depth: int = 2) -> None:
        self._q: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._buf = b""
        self._done = False
        self._t = threading.Thread(target=self._run, args=(stream, chunk),
                                   name="flight_profiler-readahead", daemon=True)
        self._t.start()

    def _run(self, stream: IO[bytes], chunk: int) -> None:
        try:
            while not self._stop.is_set():
                data = stream.read(chunk)
                self._put(data)
                if not data:
                    return
        except BaseException as exc:  # handed to the reader, raised there
            self._put(exc)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, n: int = -1) -> bytes:
        while not self._done and (n < 0 or len(self._buf) < n):
            item = self._q.get()
            if isinstance(item, BaseException):
                self._done = True
                raise item
            if not item:
                self._done = True
            self._buf += item
        if n < 0 or n >= len(self._buf):
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
