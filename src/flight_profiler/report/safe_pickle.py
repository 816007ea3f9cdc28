"""Load memory snapshot pickles without letting them run code.

A pickle is a program: ``GLOBAL os system`` + ``REDUCE`` runs a shell command on load. PyTorch's
snapshots only hold dicts, lists, strings and numbers, which pickle encodes with opcodes that
need no import at all; so every import a pickle asks for is refused, except a short list of
harmless builtin containers that older protocols spell as globals.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

_ALLOWED: dict[str, frozenset[str]] = {
    "builtins": frozenset({"set", "frozenset", "list", "dict", "tuple", "bytearray", "complex"}),
    "__builtin__": frozenset({"set", "frozenset", "list", "dict", "tuple", "bytearray", "complex"}),
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


def safe_loads(data: bytes) -> Any:
    return _Restricted(io.BytesIO(data)).load()


def looks_like_pickle(head: bytes) -> bool:
    """Protocol 2+ starts with PROTO; protocol 0/1 dicts and lists start with ( } ] (d (l."""
    if not head:
        return False
    if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5:
        return True
    return head[:2] in (b"(d", b"(l", b"}q", b"]q", b"}(", b"](", b"(dp", b"(lp")
