"""Progress of long work: a redrawn status line on a TTY, coarse journal events always.
Download workers only store numbers in a ``Track``; one thread writes journal and
console (``Progress.tick``). ``LogWatch`` tails a blocking command's log on a thread."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["LogWatch", "Progress", "Track", "human_bytes", "last_line", "terminal"]

Emit = Callable[..., None]  # emit(event, **fields): a journal event


def terminal() -> IO[str] | None:
    """Where a status line may be redrawn: stderr when it is a terminal, else None."""
    return sys.stderr if sys.stderr.isatty() else None


@dataclass
class Track:
    """One artifact's transfer as its worker sees it (written by one thread only)."""

    name: str
    total: int | None = None
    done: int = 0
    base: int = 0  # bytes already on disk when the current transfer began
    started: float = 0.0
    active: bool = False
    last_emit_t: float = 0.0
    last_emit_frac: float = 0.0

    def begin(self, have: int, clock: Callable[[], float] = time.monotonic) -> None:
        """A transfer starts with ``have`` bytes on disk."""
        self.done = self.base = have
        self.started = clock()
        self.active = True

    def update(self, done: int, total: int | None) -> None:
        """Progress callback of ``Http.stream_to``."""
        self.done = done
        if total is not None:
            self.total = total

    def rate(self, now: float) -> float:
        """Mean bytes per second of the current transfer."""
        took = now - self.started
        return (self.done - self.base) / took if took > 0 else 0.0

    def eta(self, now: float) -> float | None:
        """Seconds left at the current mean rate, or None when unknown."""
        r = self.rate(now)
        return (self.total - self.done) / r if self.total and r > 0 else None


def human_bytes(n: float) -> str:
    """``1.5 GB``-style size (decimal units, as download tools print)."""
    for unit in ("B", "kB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class _StatusLine:
    """A line redrawn in place on ``tty``; a tty that fails a write is dropped."""

    tty: IO[str] | None
    _drawn = False

    def _draw(self, text: str, width: int | None = None) -> None:
        width = width or shutil.get_terminal_size((100, 20)).columns - 1
        self._write("\r\x1b[K" + text[:width])
        self._drawn = True

    def clear(self) -> None:
        """Erase the status line (before a console line or at the end)."""
        if self.tty is not None and self._drawn:
            self._write("\r\x1b[K")
            self._drawn = False

    def _write(self, text: str) -> None:
        assert self.tty is not None
        try:
            self.tty.write(text)
            self.tty.flush()
        except (OSError, ValueError):
            self.tty = None


class Progress(_StatusLine):
    """Reports ``Track`` objects: ``artifact.progress`` events every ``every_s`` seconds
    or ``every_frac`` of the file, and a status line on ``tty`` (redrawn at most every
    ``redraw_s``; ``clear`` before anything else is written to that stream)."""

    def __init__(
        self,
        emit: Emit,
        *,
        tty: IO[str] | None = None,
        every_s: float = 2.0,
        every_frac: float = 0.1,
        redraw_s: float = 0.2,
        width: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit = emit
        self.tty = tty
        self.every_s = every_s
        self.every_frac = every_frac
        self.redraw_s = redraw_s
        self.width = width  # None: the terminal's
        self.clock = clock
        self._last_draw = 0.0

    def tick(self, tracks: Iterable[Track]) -> None:
        """Emit due events and redraw the status line."""
        now = self.clock()
        active = [t for t in tracks if t.active]
        for t in active:
            frac = t.done / t.total if t.total else 0.0
            due_t = now - max(t.last_emit_t, t.started) >= self.every_s
            due_f = t.total is not None and frac - t.last_emit_frac >= self.every_frac
            if due_t or due_f:
                t.last_emit_t, t.last_emit_frac = now, frac
                self.emit("artifact.progress", **self.fields(t, now))
        if self.tty is not None and active and now - self._last_draw >= self.redraw_s:
            self._last_draw = now
            self._draw(self._line(active, now), self.width)

    @staticmethod
    def fields(t: Track, now: float) -> dict[str, Any]:
        """The numbers of one ``artifact.progress`` event."""
        eta = t.eta(now)
        return {
            "artifact": t.name,
            "bytes": t.done,
            "total": t.total,
            "percent": round(100 * t.done / t.total, 1) if t.total else None,
            "rate_mb_s": round(t.rate(now) / 1e6, 2),
            "eta_s": round(eta, 1) if eta is not None else None,
        }

    @staticmethod
    def _line(active: list[Track], now: float) -> str:
        parts = []
        for t in active:
            eta = t.eta(now)
            pct = f"{100 * t.done / t.total:3.0f}% " if t.total else ""
            size = f"{human_bytes(t.done)}" + (f"/{human_bytes(t.total)}" if t.total else "")
            tail = f" ETA {eta:.0f}s" if eta is not None else ""
            parts.append(f"{t.name} {pct}{size} {human_bytes(t.rate(now))}/s{tail}")
        return " | ".join(parts)


_TAIL_BYTES = 4096
_LINE_CHARS = 200


def last_line(data: bytes) -> str:
    """The last non-blank line of a log's tail, stripped, at most 200 characters."""
    for raw in reversed(data.decode("utf-8", "replace").splitlines()):
        line = " ".join(raw.split())
        if line:
            return line[:_LINE_CHARS]
    return ""


def _tail(path: Path, since: float) -> str:
    """The last line of ``path`` when it was written at or after ``since`` (wall clock;
    a log left by an earlier run says nothing about this one), else ''."""
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            if st.st_mtime < since:
                return ""
            f.seek(max(0, st.st_size - _TAIL_BYTES))
            return last_line(f.read(_TAIL_BYTES))
    except OSError:
        return ""


class LogWatch(_StatusLine):
    """While a blocking command runs: elapsed time and the last line of ``log`` on ``tty``
    and ``status`` every ``poll_s``, a ``<what>.progress`` event every ``every_s``."""

    def __init__(
        self,
        log: Path,
        *,
        what: str,
        label: str,
        emit: Emit,
        status: Callable[[str], object] | None = None,
        tty: IO[str] | None = None,
        every_s: float = 10.0,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.log = log
        self.what = what
        self.label = label
        self.emit = emit
        self.status = status
        self.tty = tty
        self.every_s = every_s
        self.poll_s = min(poll_s, every_s)
        self.clock = clock
        self._since = wall() - 1.0  # mtime granularity
        self._t0 = clock()
        self._last_emit = self._t0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    def __enter__(self) -> LogWatch:
        self._t0 = self._last_emit = self.clock()
        self._thread = threading.Thread(
            target=self._loop, name=f"{self.what}-progress", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception:  # progress must never break the command
                return

    def tick(self) -> None:
        """One look at the log: redraw, STATUS=, and the event when one is due."""
        now = self.clock()
        elapsed = now - self._t0
        line = _tail(self.log, self._since)
        self.ticks += 1
        text = f"{self.label}: {elapsed:.0f} s" + (f": {line}" if line else "")
        if self.tty is not None:
            self._draw(text)
        if self.status is not None:
            self.status(text)
        if now - self._last_emit >= self.every_s:
            self._last_emit = now
            self.emit(f"{self.what}.progress", elapsed_s=round(elapsed, 1), log_line=line)
