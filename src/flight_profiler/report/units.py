"""Human units for figures in findings and views."""

from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    sign = "-" if n < 0 else ""
    v = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{sign}{v:.0f} {unit}" if unit == "B" else f"{sign}{v:.1f} {unit}"
        v /= 1024
    return f"{sign}{v:.1f} TiB"


def fmt_us(us: float | None) -> str:
    if us is None:
        return "?"
    if abs(us) >= 1_000_000:
        return f"{us / 1_000_000:.2f} s"
    if abs(us) >= 1_000:
        return f"{us / 1_000:.2f} ms"
    return f"{us:.1f} us"


def fmt_pct(p: float | None) -> str:
    return "?" if p is None else f"{p:.1f}%"


def fmt_ms(ms: float) -> str:
    """A duration for humans: ``12.3 ms``, ``0.412 ms``, ``3.1 µs``.

    The agent has its own copy (agent/values.py): it runs inside the target and imports
    nothing of the CLI side. tests/unit/test_units.py keeps the two the same.
    """
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    if ms >= 0.01:
        return f"{ms:.3f} ms"
    return f"{ms * 1000:.2f} µs"
