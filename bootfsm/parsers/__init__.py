"""Pure parsers of outside input: text in, typed value out, ParseError on garbage."""

from __future__ import annotations

__all__ = ["ParseError"]


class ParseError(ValueError):
    """Input could not be parsed; the message names the source and the problem."""
