"""Text that came from a target or a file, made safe to show on a terminal, in Markdown or HTML.

Thread names, reprs, function and file names, an agent's errors and status fields, the names
inside a trace: all are chosen by someone else, and the CLI often runs as root. A raw ESC
starts a terminal command (set the window title, clear the screen, a hyperlink, rewrite a line
already printed), a bidi override reverses what follows (``\\u202e``), a lone surrogate ends
``print`` in UnicodeEncodeError, a newline forges a line of our own output. So every such text
goes through :func:`safe_text` before a renderer prints or writes it: control, format, separator,
surrogate and unassigned characters are shown as Python escapes (``\\x1b``, ``\\u202e``,
``\\U000e0041``) and an oversized text is cut, saying how much was cut. Letters of every script,
spaces, emoji and private-use glyphs are kept as they are.

This module is a leaf (standard library only): render/, cli/ and diagnose/ all use it.
"""

from __future__ import annotations

import unicodedata

# A few thousand characters show any real name or value; a hostile megabyte-long "thread name"
# would cost the terminal (and rich's layout) far more than it tells.
DEFAULT_LIMIT = 4096
_KEEP = frozenset(("Zs", "Co"))  # spaces other than ' ' (NBSP, ideographic), private-use glyphs


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_text(value: object, limit: int | None = DEFAULT_LIMIT, *, newlines: bool = False) -> str:
    """``value`` as text that shows what it is and does nothing to the terminal.

    ``newlines=True`` keeps ``\\n`` (a multi-line text whose lines are all ours to lay out,
    e.g. a traceback the agent sent); everything else non-printable is escaped. ``limit``:
    at most that many characters are kept (None: all), then ``…(+N chars)``.
    """
    text = value if isinstance(value, str) else _str(value)
    cut = 0
    if limit is not None and len(text) > limit:
        cut = len(text) - limit
        text = text[:limit]
    if not text.isprintable():  # str.isprintable: a C loop, the common case costs nothing
        out: list[str] = []
        for ch in text:
            if ch.isprintable() or (ch == "\n" and newlines) or unicodedata.category(ch) in _KEEP:
                out.append(ch)
            else:
                out.append(_escape(ch))
        text = "".join(out)
    return text + (f"…(+{cut} chars)" if cut else "")


def _str(value: object) -> str:
    """``str(value)`` for what JSON decoding gives, without a deep structure's recursion."""
    try:
        return str(value)
    except (RecursionError, ValueError):  # ValueError: an int of over 4300 digits
        return f"<{type(value).__name__} too large to show>"


def is_safe(text: str) -> bool:
    """True when ``text`` holds nothing :func:`safe_text` would escape (tests, assertions)."""
    return safe_text(text, None, newlines=True) == text


def safe_markup(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """:func:`safe_text`, then escaped for a rich markup string (a ``[/bold]`` in a thread name
    would otherwise end rich's print in MarkupError, or restyle what follows)."""
    from rich.markup import escape  # lazy: rich only where something is rendered

    return escape(safe_text(value, limit))
