"""SIGTERM/SIGINT for one run session: stop the command in flight, raise ``Interrupted``.

A Python signal handler runs in the main thread between two bytecodes of whatever it
is doing, so an exception it raises can land inside the standard library's thread
machinery: in ``Thread.start`` waiting for the new thread, in ``Event.wait`` or in a
``Condition`` taking its lock back. Raised there, it leaves a lock released that the
enclosing ``with`` then releases again, and ``RuntimeError: release unlocked lock``
replaces the interruption (the run ended 110 instead of 12 when a signal came while
the fetch pool started its threads). So the handler looks where the main thread is:
inside ``threading``, ``queue`` or ``concurrent.futures`` it raises nothing yet, and
an interval timer (SIGALRM every ``RETRY_S``) looks again until the main thread is back
in code that can take the exception; the command in flight is stopped and
``Interrupted`` raised there. Those moments are short: the main thread's long waits
block in C (a child's pidfd, ``SimpleQueue.get`` in the fetch loop, ``time.sleep``),
where the exception is raised at once.
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
    """The session's signal handling (see the module docstring).

    Signals raise only inside ``armed()`` (the lock wait and the body); one that arrives
    outside is remembered and raised when ``armed()`` is next entered, or ignored once
    the run has concluded. Only the first signal acts: a second one while stopping
    (systemd and a terminal may both send one) is ignored.
    """

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
