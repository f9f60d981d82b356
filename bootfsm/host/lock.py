"""Single instance per node: an flock on a file in the state directory.

flock locks die with their process, so a lock left by a killed run never blocks.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["NodeLock"]


class NodeLock:
    """Exclusive lock on ``path``; ``acquire(wait)`` returns False if still held after ``wait``."""

    def __init__(self, path: Path, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.path = path
        self._fd: int | None = None
        self._sleep = sleep

    def holder(self) -> str:
        """The pid recorded by the current holder ('' if unknown)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def acquire(self, wait: float = 0.0) -> bool:
        """Take the lock, polling up to ``wait`` seconds; record our pid in the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        end = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= end:
                    os.close(fd)
                    return False
                self._sleep(min(0.2, max(0.0, end - time.monotonic())))
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
