"""What one call of a method does with autograd (``torch grads METHOD``): whether it saves
tensors for a backward, how many bytes of them, and whether a backward used any.

A ``saved_tensors_hooks`` pair is entered in the calling thread right before the call and left
right after it (thread-local, nested inside anything the program itself uses): ``pack`` sees
every tensor an op saves for backward (the activations a graph keeps alive), ``unpack`` every
one a backward reads back. A call that saves megabytes and unpacks nothing built a graph that no
backward used during the call: evaluation with autograd on. Parameters (leaves that require
grad) are not counted: they are alive anyway. Storages are counted once; nothing is kept.

What the graph keeps is what ``pack`` returns, so it must leave the program's autograd exactly as
it was (faithful_pack / faithful_unpack): a detached alias, never the tensor itself (a saved
output returned as is holds its own grad_fn: a reference cycle through C++ that no garbage
collection frees, so an evaluation graph built while measured lived forever: 50 of 50 outputs
measured alive after del and gc.collect() with torch 2.13), and the version the tensor had when
saved, checked on unpack, because with hooks torch no longer checks it: a program that modifies
a saved tensor in place gets the same RuntimeError it gets without us, never silently wrong
gradients.
"""

from __future__ import annotations

from typing import Any

from . import targets

# Generators, coroutines, async generators: their "call" spans suspensions, during which other
# code runs and may push/pop its own thread-local hooks or modes: entering ours at the start and
# leaving at the end would not nest.
SUSPENDS = 0x20 | 0x80 | 0x200


def suspends(spec: dict[str, Any]) -> bool:
    """True when the method named by ``spec`` is a generator or coroutine function."""
    return bool(targets.resolve(spec).code.co_flags & SUSPENDS)


_MODIFIED = ("one of the variables needed for gradient computation has been modified by an "
             "inplace operation: [{what}] is at version {now}; expected version {saved} instead "
             "(torch raises the same error; it was saved while flight_profiler measured the call)")


def faithful_pack(t: Any) -> Any:
    """What a graph keeps for ``t``: a detached alias (no cycle) and its version when saved."""
    try:
        d = t.detach()
    except Exception:  # a tensor subclass that cannot be detached: kept as torch would
        return (t, None)
    try:
        version = d._version
    except Exception:  # no version counter (inference tensors): nothing to check
        version = None
    return (d, version)


def faithful_unpack(packed: Any) -> Any:
    d, version = packed
    if version is not None:
        try:
            now = d._version
        except Exception:
            now = version
        if now != version:
            what = f"{type(d).__name__} {list(getattr(d, 'shape', ()))}"
            raise RuntimeError(_MODIFIED.format(what=what, now=now, saved=version))
    return d


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
        return faithful_pack(t)

    def _unpack(self, packed: Any) -> Any:
        self.unpacked += 1
        return faithful_unpack(packed)

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
