"""Deadlines on a monotonic clock: a wall clock that jumps cannot stretch or cut them."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
    """A point in monotonic time; ``remaining()`` never goes below zero. ``note`` says
    where a global deadline came from (after "global deadline of N s" in its error)."""

    def __init__(self, seconds: float, clock: Callable[[], float], note: str = "") -> None:
        self.clock = clock
        self.seconds = seconds
        self.end = clock() + seconds
        self.note = note

    def remaining(self) -> float:
        """Seconds left, at least 0."""
        return max(0.0, self.end - self.clock())
