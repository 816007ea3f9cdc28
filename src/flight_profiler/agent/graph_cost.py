"""What one call of a method does with autograd (``torch grads METHOD``): whether it saves
tensors for a backward, how many bytes of them, and whether a backward used any.

A ``saved_tensors_hooks`` pair is entered in the calling thread right before the call and left
right after it (thread-local, nested inside anything the program itself uses): ``pack`` sees
every tensor an op saves for backward (the activations a graph keeps alive), ``unpack`` every
one a backward reads back. A call that saves megabytes and unpacks nothing built a graph that no
backward used during the call: evaluation with autograd on. Parameters (leaves that require
grad) are not counted: they are alive anyway. Storages are counted once; nothing is kept.
"""

from __future__ import annotations

from typing import Any

from . import targets

# Generators, coroutines, async generators: their "call" spans suspensions, during which other
# code runs and may push/pop its own thread-local hooks or modes: entering ours at the start and
# leaving at the end would not nest.
_SUSPENDS = 0x20 | 0x80 | 0x200


def suspends(spec: dict[str, Any]) -> bool:
    """True when the method named by ``spec`` is a generator or coroutine function."""
    return bool(targets.resolve(spec).code.co_flags & _SUSPENDS)


class CallGraphCost:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._ctx: Any = None
        self._seen: set[int] = set()
        self.saved_tensors = 0
        self.saved_bytes = 0
        self.unpacked = 0
        self.grad_enabled = False

    def _pack(self, t: Any) -> Any:
        try:
            if not (t.is_leaf and t.requires_grad):
                self.saved_tensors += 1
                st = t.untyped_storage()
                key = st.data_ptr()
                if key not in self._seen:
                    self._seen.add(key)
                    self.saved_bytes += st.nbytes()
        except Exception:  # never into the target's op
            pass
        return t

    def _unpack(self, t: Any) -> Any:
        self.unpacked += 1
        return t

    def enter(self) -> None:
        self.grad_enabled = bool(self.torch.is_grad_enabled())
        self._ctx = self.torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()

    def exit(self) -> dict[str, Any]:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)
        self._seen.clear()
        return {"grad_enabled": self.grad_enabled, "saved_tensors": self.saved_tensors,
                "saved_bytes": self.saved_bytes, "unpacked": self.unpacked}
