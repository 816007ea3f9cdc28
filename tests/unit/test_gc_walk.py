"""agent/gc_walk.py: the one walk over gc's objects (optimizers, modules, tensors)."""

from __future__ import annotations

import time
import warnings

from flight_profiler.agent.gc_walk import GcWalk, live_instances


class _Thing:
    pass


class _Sub(_Thing):
    pass


class _Proxy:
    """Reading __class__ warns, as torch's deprecated module proxies do."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        warnings.warn("read __class__", FutureWarning, stacklevel=2)
        return _Thing


def test_subclasses_found_and_class_never_read() -> None:
    keep = [_Thing(), _Sub(), _Proxy()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = [o for o in live_instances(_Thing) if o in keep]
    assert {id(o) for o in found} == {id(keep[0]), id(keep[1])}


def test_a_cut_walk_says_how_much_it_did_not_see() -> None:
    keep = [_Thing() for _ in range(10)]
    walk = GcWalk(_Thing, limit=1000)
    list(walk)
    assert walk.total > 1000 and walk.unscanned == walk.total - 1000
    past = GcWalk(_Thing, deadline=time.monotonic() - 1.0)  # cut after the first chunk
    list(past)
    assert past.unscanned == max(0, past.total - 65536)
    whole = GcWalk(_Thing)
    assert sum(1 for o in whole if o in keep) == 10 and whole.unscanned == 0
    del keep
