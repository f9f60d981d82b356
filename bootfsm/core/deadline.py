"""Deadlines on a monotonic clock: a wall clock that jumps cannot stretch or cut them."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
    """A point in monotonic time; ``remaining()`` never goes below zero."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds = seconds
        self.end = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, at least 0."""
        return max(0.0, self.end - self.clock())
