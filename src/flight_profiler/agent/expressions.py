"""The text of ``watch``/``trace`` expressions (``--expr``, ``-f``), read the same way on both
sides: the CLI checks it before attaching, the agent before compiling it in the target.

One scanner walks the text outside string literals, tracking bracket depth; splitting on
top-level commas and measuring nesting are both views of that walk, so the CLI and the agent
can never disagree on where an expression ends. Standard library only (a contract module:
the CLI imports it, see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator


def _outside_strings(text: str) -> Iterator[tuple[int, str, int]]:
    """``(index, character, bracket depth after it)`` for each character outside string
    literals (quotes included neither). Linear; an unclosed string ends the walk."""
    depth = 0
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1  # an escaped quote does not close the string
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif ch in "'\"":
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            i += len(quote) - 1
        else:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            yield i, ch, depth
        i += 1


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and string literals: ``"a[0, 1], f(x, y)"`` -> 2 parts."""
    parts, start = [], 0
    for i, ch, depth in _outside_strings(text):
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def nesting(text: str) -> int:
    """How deep the compiler's tree of ``text`` may go: brackets, plus runs of unary signs
    (``- - - x`` nests one node per sign), which blow its stack just the same."""
    deepest = run = 0
    for _, ch, depth in _outside_strings(text):
        if ch in "([{":
            deepest = max(deepest, depth + run)
        elif ch in "-+~":
            run += 1
            deepest = max(deepest, depth + run)
        elif not ch.isspace() and ch not in ")]}":
            run = 0
    return deepest
