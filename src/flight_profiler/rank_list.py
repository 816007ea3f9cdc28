"""Rank lists as users type and read them: ``"0,3-5"`` <-> [0, 3, 4, 5]."""

from __future__ import annotations

from flight_profiler.errors import UsageError


def parse_ranks(spec: str) -> set[int]:
    """``"0,3-5"`` -> {0, 3, 4, 5}."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a or a < 0:
                    raise ValueError
                out.update(range(a, b + 1))
            else:
                if int(lo) < 0:
                    raise ValueError
                out.add(int(lo))
        except ValueError:
            raise UsageError(f"bad --ranks value {part!r}",
                             "use rank numbers and ranges, e.g. --ranks 0,3-5") from None
    if not out:
        raise UsageError("--ranks names no rank", "e.g. --ranks 0,3-5")
    return out


def format_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out: list[str] = []
    values = sorted(set(ranks))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def ranks_label(ranks: list[int] | None) -> str:
    """How a finding names its ranks in a view: "" (not a job finding), "ranks 0-2", "whole job"."""
    if ranks is None:
        return ""
    if not ranks:
        return "whole job"
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"
