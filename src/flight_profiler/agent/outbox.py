"""Streamed events of one request, sent by their own thread.

Hooks call ``ctx.emit`` from the target's own threads (its training loop). A client that reads
slowly, or not at all, fills the socket buffer; a blocking send there would stall the target.
So ``emit`` only queues (bounded), a sender thread writes, and what does not fit is counted and
dropped, never waited for.

The sender takes everything queued at once and writes it in one ``sendall``: each send releases
the GIL, and beside a busy target getting it back costs a switch interval (5 ms), so one event
per send would cap the stream at a few hundred events a second and add a GIL hand-off to the
target per event. The queue is a deque and an Event set only when the sender sleeps: queueing
an event takes no lock (a ``queue.Queue`` took two, and woke the sender for every event).
"""

from __future__ import annotations

import collections
import threading

TYPE_CHECKING = False  # not typing's: a target without it pays ~5 ms for it (issue 23)
if TYPE_CHECKING:
    from typing import Any, Callable

_STOP = object()
_BATCH = 512  # events written by one sendall at most


class Outbox:
    def __init__(self, send: Callable[[dict[str, Any]], None], req_id: Any,
                 thread_name: str, limit: int = 10000,
                 encode: Callable[[dict[str, Any]], bytes] | None = None,
                 send_bytes: Callable[[bytes], None] | None = None) -> None:
        """``send`` writes one message; with ``encode`` and ``send_bytes`` (a frame's bytes,
        and a raw write) the sender writes whatever is queued in one go instead."""
        self._send = send
        self._encode = encode
        self._send_bytes = send_bytes
        self._req_id = req_id
        self._thread_name = thread_name
        self._limit = limit
        self._items: collections.deque[Any] = collections.deque()
        self._ready = threading.Event()  # set when there is something for the sender
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
                    thread = threading.Thread(target=self._run, name=self._thread_name,
                                              daemon=True)
                    try:
                        thread.start()
                    except RuntimeError:  # no thread to spare now: drop, a later emit retries
                        self.dropped += 1
                        return
                    self._thread = thread
        if len(self._items) >= self._limit:
            self.dropped += 1
            return
        self._items.append({"type": "event", "id": self._req_id, "data": data})
        if not self._ready.is_set():
            self._ready.set()

    def _run(self) -> None:
        items, ready = self._items, self._ready
        while True:
            ready.wait()
            ready.clear()  # before draining: what comes after this sets it again
            while items:
                batch: list[Any] = []
                stop = False
                while items and len(batch) < _BATCH:
                    item = items.popleft()
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
                if self._closed:  # flush gave up on us: these never go out, say so
                    self.dropped += len(batch)
                    return
                if not self.broken and batch:  # else drain: keep no reference to the events
                    self._write(batch)
                del batch  # and the last item: keep no reference to the events
                item = None
                if stop:
                    return

    def _write(self, batch: list[Any]) -> None:
        try:
            if self._encode is None or self._send_bytes is None:
                for item in batch:
                    try:
                        self._send(item)
                    except OSError:
                        raise
                    except Exception:  # an event that cannot be encoded: skip it
                        self.dropped += 1
                return
            frames = []
            for item in batch:
                try:
                    frames.append(self._encode(item))
                except Exception:  # an event that cannot be encoded: skip it, keep the stream
                    self.dropped += 1
            if frames:
                self._send_bytes(b"".join(frames))
        except OSError:
            self.broken = True

    def flush(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout``), then stop the sender; drop the rest."""
        thread = self._thread
        if thread is None:
            return
        self._items.append(_STOP)
        self._ready.set()
        thread.join(timeout)
        if thread.is_alive():  # stuck in a send to a client that does not read
            self.broken = True
        self._closed = True
        # whatever is left holds data from the target: let it go, counted (the result says how
        # many events never went out, so that sent + dropped is every event emitted)
        self.dropped += sum(1 for item in list(self._items) if item is not _STOP)
        self._items.clear()
        # The clear may have taken the stop marker: a sender still stuck in a send would then
        # wait for ever once the send returns. Leave it a marker to end on.
        self._items.append(_STOP)
        self._ready.set()
