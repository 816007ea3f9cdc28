"""The live objects of some classes, found by walking gc's objects.

type() + a memo of issubclass, never isinstance(): isinstance() reads ``__class__``, which on
torch's deprecated module proxies (torch.distributed.reduce_op) prints a FutureWarning into the
target's stderr, and costs a lookup per object where the memo costs one per class.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

_CHUNK = 65536  # objects between two looks at the clock


class GcWalk:
    """One walk over gc's objects, cut at a deadline or an object budget.

    ``total`` and ``unscanned`` are set once the walk has ended (exhausted or cut): what the
    caller says it could not see. The big ``gc.get_objects()`` list is dropped as soon as the
    walk ends, closed early included (a census would otherwise keep every object alive).
    """

    def __init__(self, classes: type | tuple[type, ...], deadline: float | None = None,
                 limit: int | None = None) -> None:
        self.classes = classes
        self.deadline = deadline
        self.limit = limit
        self.total = 0
        self.unscanned = 0

    def __iter__(self) -> Iterator[Any]:
        objects = gc.get_objects()
        self.total = total = len(objects)
        end = total if self.limit is None else min(total, self.limit)
        memo: dict[type, bool] = {}
        classes = self.classes
        i = 0
        try:
            while i < end:
                for obj in objects[i:min(i + _CHUNK, end)]:
                    t = type(obj)
                    hit = memo.get(t)
                    if hit is None:
                        hit = memo[t] = issubclass(t, classes)
                    if hit:
                        yield obj
                obj = None
                i += _CHUNK
                if self.deadline is not None and time.monotonic() > self.deadline:
                    break
        finally:
            self.unscanned = total - min(i, end)
            del objects


def live_instances(classes: type | tuple[type, ...]) -> Iterator[Any]:
    """Every gc-tracked object whose class is a subclass of ``classes``."""
    return iter(GcWalk(classes))
