"""``module [class] method`` as a user types it: the one parser the CLI and diagnose share."""

from __future__ import annotations

from collections.abc import Sequence

from flight_profiler.errors import UsageError


def split_method_words(
    words: Sequence[str],
    after: str = "",
    hint: str = "e.g. `__main__ train_step` or `mypkg.trainer Trainer step`",
) -> tuple[str, str | None, str]:
    """``mod func``, ``mod Class meth`` or ``mod Class.meth`` -> (module, class or None, method)."""
    words = list(words)
    if len(words) == 2:
        module, method = words
        cls: str | None = None
        if "." in method:
            cls, method = method.rsplit(".", 1)
        return module, cls, method
    if len(words) == 3:
        return words[0], words[1], words[2]
    raise UsageError(
        f"expected `module [class] method`{after}, got {' '.join(words) or 'nothing'}", hint
    )
