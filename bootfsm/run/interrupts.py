"""SIGTERM/SIGINT for one run session: stop the command in flight, raise ``Interrupted``.

Never raised inside the standard library's thread machinery (docs/systemd.md): it is
deferred and looked at again every ``RETRY_S`` by SIGALRM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from bootfsm.host.host import Host
from bootfsm.machine.engine import Interrupted

__all__ = ["RETRY_S", "Interrupts", "in_thread_machinery"]

RETRY_S = 0.01  # how often a deferred signal looks again
_LIB = os.path.dirname(threading.__file__)  # the standard library, without importing more of it
_FILES = frozenset({threading.__file__, os.path.join(_LIB, "queue.py")})
_DIRS = (os.path.join(_LIB, "concurrent", "futures", ""),)


def in_thread_machinery(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller of it runs code of ``threading``, ``queue`` or
    ``concurrent.futures``, where an exception raised asynchronously can break a lock."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name in _FILES or name.startswith(_DIRS):
            return True
        frame = frame.f_back
    return False


class Interrupts:
    """The session's signal handling: a signal raises only inside ``armed()`` (one outside
    is raised on the next entry); only the first acts (systemd and a terminal may both send)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, host: Host) -> None:
        self.host = host
        self.pending: str | None = None
        self.stopped: list[str] = []  # argv of the command the signal stopped
        self._armed = False
        self._deferred = False  # the retry timer is running
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            signals = (*self.SIGNALS, signal.SIGALRM)
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_timer()
        for s, h in self._previous.items():
            signal.signal(s, h)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Raise ``Interrupted`` for a signal pending now or arriving inside the block."""
        if self.pending is not None:
            raise Interrupted(self.pending)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGALRM:
            if self.pending is not None:
                return
            self.pending = signal.Signals(signum).name
        signame = self.pending
        if signame is None or (signum == signal.SIGALRM and not self._deferred):
            return  # not our timer's
        if not self._armed:
            self._stop_timer()
            return
        # raised there, a ``with`` releases a lock twice: RuntimeError (110) replaces 12
        if in_thread_machinery(frame):
            if not self._deferred:
                self._deferred = True
                signal.setitimer(signal.ITIMER_REAL, RETRY_S, RETRY_S)
            return
        self._stop_timer()
        self._armed = False
        stopped = self.host.stop_child()  # the command in flight and its whole group
        if stopped is not None:
            self.stopped = stopped
        raise Interrupted(signame)

    def _stop_timer(self) -> None:
        if self._deferred:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._deferred = False
