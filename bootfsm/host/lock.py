"""Single instance per node: an flock on a file in the state directory.

flock locks die with their process, so a lock left by a killed run never blocks.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host

__all__ = ["NodeLock", "own_dirs"]


def own_dirs(host: Host, *node_dirs: str) -> None:
    """Create or check bootfsm's own directories (``Host.own_dir``) before the lock is
    taken in the first: ``BootError`` UNSAFE_STATE_DIR or HOST_IO_ERROR otherwise."""
    for d in node_dirs:
        if d:
            host.own_dir(d)


class NodeLock:
    """Exclusive lock on ``path``; ``acquire(wait)`` returns False if still held after ``wait``."""

    def __init__(self, path: Path, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.path = path
        self._fd: int | None = None
        self._sleep = sleep

    def holder(self) -> str:
        """The pid recorded by the current holder ('' if unknown)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as fh:
            return fh.read(64).decode(errors="replace").strip()

    def acquire(self, wait: float = 0.0) -> bool:
        """Take the lock, polling up to ``wait`` seconds; record our pid in the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # never through a planted link: O_NOFOLLOW, and only a regular file
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise BootError(
                Code.UNSAFE_STATE_FILE,
                f"{self.path} is a symlink; bootfsm never follows a link in its state dir",
            ) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BootError(Code.UNSAFE_STATE_FILE, f"{self.path} is not a regular file")
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
