"""One short quote of outside text for a message: bounded when it is made.

A line of an index, a command's output, a header or a manifest value can be megabytes;
a message quotes at most ``LIMIT`` characters of it, with where they are and the whole
length, never the whole (docs/security.md, trust table).
"""

from __future__ import annotations

__all__ = ["LIMIT", "excerpt"]

LIMIT = 60
"""Characters quoted by default."""


def excerpt(value: object, limit: int = LIMIT, *, at: int = 0, quote: bool = True) -> str:
    """``value`` quoted for a message: a string of at most ``limit`` characters as its
    repr; a longer one as ``limit`` characters from ``at``, then where they are and the
    whole length (``'abc...' (characters 1-60 of 1048576)``). ``quote=False`` leaves
    printable text (a name in a message's context) unquoted. A JSON container is named
    with its size, never printed; a number or None as its (short) repr."""
    if isinstance(value, str):
        start = max(0, min(at, len(value)))
        part = value[start : start + limit]
        shown = part if not quote and part.isprintable() else repr(part)
        if start == 0 and len(part) == len(value):
            return shown
        lead = "..." if start else ""
        tail = "..." if start + len(part) < len(value) else ""
        where = f"characters {start + 1}-{start + len(part)} of {len(value)}"
        return f"{lead}{shown}{tail} ({where})"
    if isinstance(value, dict):
        return f"an object of {len(value)} members"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**20 else f"an integer of {value.bit_length()} bits"
    return f"a {type(value).__name__}"
