from __future__ import annotations

from collections.abc import Iterator
from typing import Callable

import pytest

from support import Target, spawn


@pytest.fixture
def spawn_target() -> Iterator[Callable[..., Target]]:
    """spawn_target(code, python=..., ready="READY") -> Target; every target is stopped after."""
    targets: list[Target] = []

    def _spawn(code: str, **kwargs: object) -> Target:
        t = spawn(code, **kwargs)  # type: ignore[arg-type]
        targets.append(t)
        return t

    yield _spawn
    for t in targets:
        t.stop()
