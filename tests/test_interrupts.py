"""A signal that lands inside the standard library's thread machinery still ends the run
interrupted (12), never with the lock error it would cause there (110).

CI once saw SIGTERM arrive while ``ThreadPoolExecutor.submit`` waited in ``Thread.start``
for the new thread: the handler's exception came out of ``Condition._acquire_restore``
before it re-took the lock, ``Event.wait``'s ``with`` then released an unlocked lock, and
``RuntimeError: release unlocked lock`` replaced the interruption. These tests put the
signal at exactly that bytecode with a trace function, so the case is not left to
timing.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.host.host import Host
from bootfsm.machine.engine import Interrupted
from bootfsm.machine.table import stop_after
from bootfsm.run.interrupts import Interrupts
from bootfsm.run.session import Session, SessionOptions, run_session


def _signal_at_lock_retake(signum: int) -> Any:
    """A trace function that raises ``signum`` once, as a ``Condition`` built on a
    plain lock (an Event's) enters ``_acquire_restore`` to take its lock back."""
    fired = []

    def tracer(frame: FrameType, event: str, _arg: object) -> Any:
        code = frame.f_code
        if (
            not fired
            and event == "call"
            and code.co_name == "_acquire_restore"
            and code.co_filename == threading.__file__
        ):
            fired.append(True)
            signal.raise_signal(signum)  # the handler runs here, inside threading
        return None

    return tracer


def _wait_for_event_set_later(tracer: Any) -> threading.Event:
    """Block in ``Event.wait`` (traced) until another thread sets it 50 ms later."""
    ev = threading.Event()
    threading.Timer(0.05, ev.set).start()
    sys.settrace(tracer)
    try:
        ev.wait()
    finally:
        sys.settrace(None)
    return ev


def test_signal_while_a_condition_retakes_its_lock_raises_interrupted_after_it(
    tmp_path: Path,
) -> None:
    """The handler defers inside threading code and raises once the main thread is back
    in ordinary code; the Event it interrupted is left consistent and usable."""
    waited: list[threading.Event] = []
    interrupts = Interrupts(Host(tmp_path))
    with interrupts, pytest.raises(Interrupted) as caught, interrupts.armed():
        waited.append(_wait_for_event_set_later(_signal_at_lock_retake(signal.SIGTERM)))
        end = time.monotonic() + 5
        while time.monotonic() < end:  # the deferred raise lands in this loop
            time.sleep(0.001)
    assert caught.value.signame == "SIGTERM"
    assert interrupts.pending == "SIGTERM"
    ev = waited[0]
    assert ev.is_set() and ev.wait(0)  # its lock is free and works
    ev.clear()
    threading.Timer(0.01, ev.set).start()
    assert ev.wait(2)


def test_the_retry_timer_stops_with_the_session(tmp_path: Path) -> None:
    """A signal deferred until after the armed block is remembered, the interval timer
    is gone when the session ends, and SIGALRM's own handler is back."""
    before = signal.getsignal(signal.SIGALRM)
    with Interrupts(Host(tmp_path)) as interrupts:
        with interrupts.armed():
            _wait_for_event_set_later(_signal_at_lock_retake(signal.SIGINT))
        assert interrupts.pending == "SIGINT"
        with pytest.raises(Interrupted), interrupts.armed():  # raised at once
            pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == before


class _BrokenOnTheWayOut:
    """A state whose cleanup fails while a signal unwinds it (what a lock the signal
    left half-released does): the run must still end interrupted."""

    @staticmethod
    def satisfied(_ctx: object) -> bool:
        return False

    @staticmethod
    def run(_ctx: object) -> None:
        try:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(5)
        finally:
            raise RuntimeError("release unlocked lock")


def test_an_error_raised_while_a_signal_unwinds_a_state_ends_interrupted(
    tmp_path: Path,
) -> None:
    def body(s: Session) -> Any:
        return s.drive({"detect": _BrokenOnTheWayOut}, {}, stop_after("detect"))

    result = run_session(Config(), SessionOptions(root=tmp_path), body)
    assert result.outcome.code is Code.INTERRUPTED, result.outcome
    assert result.outcome.message.startswith("interrupted by SIGTERM in state detect")
    assert result.journal is not None
    events = result.journal.read_text()
    assert '"event": "run.interrupted"' in events or '"event":"run.interrupted"' in events
    assert "state.failed" not in events  # not journaled as a failure of the state
