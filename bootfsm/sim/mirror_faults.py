"""The faults a :class:`mirror.Mirror` can inject, and its request log entry.

Each fault makes a path fail the way real mirrors do: 404s (:class:`NotFound`), 5xx
bursts with Retry-After (:class:`Status`), a connection dropped mid-body
(:class:`DropMidBody`), corrupted bytes (:class:`Corrupt`), a stall (:class:`Stall`),
a slow link (:class:`Throttle`), a resume answered with other bytes (:class:`BadRange`).
:mod:`mirror` re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "BODY_FAULTS",
    "BadRange",
    "Corrupt",
    "DropMidBody",
    "Fault",
    "LogEntry",
    "NotFound",
    "RouteHandler",
    "Rule",
    "Stall",
    "Status",
    "Throttle",
]


@dataclass(frozen=True)
class NotFound:
    """Always answer 404."""


@dataclass(frozen=True)
class Status:
    """Answer ``code`` (with Retry-After if set) ``times`` times, then serve normally.

    retry_after is sent as ``%g`` of the float: integral values give standard
    delta-seconds; fractions ("0.1") keep tests fast but are non-standard.
    """

    code: int
    times: int = 1
    retry_after: float | None = None

    def __post_init__(self) -> None:
        if not 100 <= self.code <= 599 or self.times < 1:
            raise ValueError("Status needs 100 <= code <= 599 and times >= 1")


@dataclass(frozen=True)
class DropMidBody:
    """Send full headers, ``fraction`` of the body, then shut the connection (GET only)."""

    times: int = 1
    fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.times < 1 or not 0.0 <= self.fraction < 1.0:
            raise ValueError("DropMidBody needs times >= 1 and 0 <= fraction < 1")


@dataclass(frozen=True)
class Corrupt:
    """Serve the content with the byte at offset size//2 flipped (same length, same ETag),
    ``times`` times (None = always: the mirror's file itself is bad)."""

    times: int | None = None


@dataclass(frozen=True)
class Stall:
    """Send headers, then sleep ``seconds`` before the body (``times``; None = always)."""

    seconds: float
    times: int | None = None


@dataclass(frozen=True)
class Throttle:
    """Pace each response body to about ``bytes_per_second``."""

    bytes_per_second: int

    def __post_init__(self) -> None:
        if self.bytes_per_second < 1:
            raise ValueError("Throttle needs bytes_per_second >= 1")


@dataclass(frozen=True)
class BadRange:
    """Answer a ranged GET (``bytes=N-`` or ``bytes=N-M``, N > 0) with a well-formed
    ``206`` for other bytes: its range starts ``shift`` bytes before N (at 0 at the
    least), and its total claims ``extra`` bytes more than the file has. The body is
    exactly what its ``Content-Range`` names and ``Content-Length`` counts, with the
    file's own ETag: a CDN edge that lost track of the range, honest about HTTP but
    not about the bytes. A request without a range, or from byte 0, is served as usual
    and does not use the fault up (``times``; None = always)."""

    shift: int = 0
    extra: int = 0
    times: int | None = 1

    def __post_init__(self) -> None:
        if self.shift < 0 or self.extra < 0 or not (self.shift or self.extra):
            raise ValueError("BadRange needs shift >= 0, extra >= 0, one of them > 0")


Fault = NotFound | Status | DropMidBody | Corrupt | Stall | Throttle | BadRange
RouteHandler = Callable[[], tuple[int, dict[str, str], bytes]]
BODY_FAULTS = (DropMidBody, Corrupt, Stall, Throttle, BadRange)


class LogEntry(NamedTuple):
    """One answered request; path excludes the query; bytes_sent counts body bytes."""

    method: str
    path: str
    status: int
    range_header: str | None
    bytes_sent: int


@dataclass
class Rule:
    pattern: str
    fault: Fault
    remaining: int | None  # None: unlimited
