"""Load memory snapshot pickles without letting them run code.

A pickle is a program: ``GLOBAL os system`` + ``REDUCE`` runs a shell command on load. PyTorch's
snapshots only hold dicts, lists, strings and numbers, which pickle encodes with opcodes that
need no import at all; so every import a pickle asks for is refused, except a short list of
harmless builtin containers that older protocols spell as globals.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

_ALLOWED: dict[str, frozenset[str]] = {
    # No bytearray: ``bytearray(2_000_000_000)`` is 32 bytes of pickle and 2 GB of memory.
    "builtins": frozenset({"set", "frozenset", "list", "dict", "tuple", "complex"}),
    "__builtin__": frozenset({"set", "frozenset", "list", "dict", "tuple", "complex"}),
    "collections": frozenset({"OrderedDict", "defaultdict", "deque"}),
    "_codecs": frozenset(),
}


class UnsafePickle(pickle.UnpicklingError):
    """The pickle asked to import something that is not a plain container."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise UnsafePickle(f"refused to load {module}.{name}: snapshots hold only plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle("refused a persistent id: snapshots hold only plain data")


class TooLarge(pickle.UnpicklingError):
    """The pickle is longer than the caller allowed."""


class _Limited:
    """A read-only view of a stream that refuses to go past ``limit`` bytes.

    The unpickler reads from it as it goes, so a corrupt or foreign file is refused at its
    first bad opcode instead of after reading (and decompressing) all of it.
    """

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self._stream = stream
        self._left = limit

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > self._left:
            data = self._stream.read(self._left + 1)
            if len(data) > self._left:
                raise TooLarge("too large")
            self._left -= len(data)
            return data
        data = self._stream.read(n)
        self._left -= len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        line = self._stream.readline(self._left + 1)
        if len(line) > self._left:
            raise TooLarge("too large")
        self._left -= len(line)
        return line


def limited(stream: IO[bytes], limit: int) -> IO[bytes]:
    return _Limited(stream, limit)  # type: ignore[return-value]


def safe_loads(data: bytes | IO[bytes], budget: int | None = None) -> Any:
    """Unpickle with the restricted unpickler; with ``budget``, under a memory cap.

    A pickle's size says little about its memory: each one-byte EMPTY_DICT opcode is a 64-byte
    dict. So the address space this process may grow by while unpickling is capped
    (RLIMIT_AS, restored afterwards); past it, MemoryError, which the caller reports.
    """
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    with address_space_cap(budget):
        return _Restricted(stream).load()


class address_space_cap:
    """While inside, this process may grow by at most ``budget`` bytes of address space
    (RLIMIT_AS, restored on exit; Linux only, else no cap); past it allocations fail with
    MemoryError."""

    def __init__(self, budget: int | None) -> None:
        self._budget = budget
        self._saved: tuple[int, int] | None = None

    def __enter__(self) -> None:
        if self._budget is None:
            return
        try:
            import resource

            with open("/proc/self/statm") as fh:
                vm = int(fh.read().split()[0]) * resource.getpagesize()
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            cap = vm + self._budget
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            if soft == resource.RLIM_INFINITY or cap < soft:
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
                self._saved = (soft, hard)
        except (ImportError, OSError, ValueError):
            self._saved = None  # not Linux: no cap, the size limit still holds

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, self._saved)


def looks_like_pickle(head: bytes) -> bool:
    """Protocol 2+ starts with PROTO; protocol 0/1 dicts and lists start with ( } ] (d (l."""
    if not head:
        return False
    if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5:
        return True
    return head[:2] in (b"(d", b"(l", b"}q", b"]q", b"}(", b"](", b"(dp", b"(lp")
