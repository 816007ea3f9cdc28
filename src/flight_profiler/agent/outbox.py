"""Streamed events of one request, sent by their own thread.

Hooks call ``ctx.emit`` from the target's own threads (its training loop). A client that reads
slowly, or not at all, fills the socket buffer; a blocking send there would stall the target.
So ``emit`` only queues (bounded), a sender thread writes, and what does not fit is counted and
dropped, never waited for.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable

_STOP = object()


class Outbox:
    def __init__(self, send: Callable[[dict[str, Any]], None], req_id: Any,
                 thread_name: str, limit: int = 10000) -> None:
        self._send = send
        self._req_id = req_id
        self._thread_name = thread_name
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=limit)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.broken = False
        self.dropped = 0
        self._closed = False  # set by flush: the sender ends at its next item

    def emit(self, data: dict[str, Any]) -> None:
        """Queue one event; raises OSError once the client is gone (the request then cancels)."""
        if self.broken:
            raise OSError("the client is gone")
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._thread_name,
                                                    daemon=True)
                    self._thread.start()
        try:
            self._queue.put_nowait({"type": "event", "id": self._req_id, "data": data})
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP or self._closed:
                return
            if self.broken:
                continue  # drain: keep no reference to the events
            try:
                self._send(item)
            except OSError:
                self.broken = True
            except Exception:  # an event that cannot be encoded: skip it, keep the stream
                self.dropped += 1
            del item

    def flush(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout``), then stop the sender; drop the rest."""
        thread = self._thread
        if thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            self.broken = True
        thread.join(timeout)
        if thread.is_alive():  # stuck in a send to a client that does not read
            self.broken = True
        self._closed = True
        while True:  # whatever is left holds data from the target: let it go
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        # The drain may have taken the stop marker: a sender still stuck in a send would then
        # wait in get() forever once the send returns. Leave it a marker to end on.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)
