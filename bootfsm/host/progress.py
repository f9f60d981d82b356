"""Download progress: a redrawn status line on a TTY, coarse journal events always.

Workers only store numbers in a ``Track`` (plain attribute writes); the thread that
owns the journal and the console calls ``Progress.tick`` now and then, so the journal
and the terminal are written from one thread only.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Progress", "Track", "human_bytes"]

Emit = Callable[..., None]  # emit(event, **fields): a journal event


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
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover - loop always returns


class Progress:
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
        self._drawn = False
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
            self._draw(active, now)

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

    def _draw(self, active: list[Track], now: float) -> None:
        assert self.tty is not None
        parts = []
        for t in active:
            eta = t.eta(now)
            pct = f"{100 * t.done / t.total:3.0f}% " if t.total else ""
            size = f"{human_bytes(t.done)}" + (f"/{human_bytes(t.total)}" if t.total else "")
            tail = f" ETA {eta:.0f}s" if eta is not None else ""
            parts.append(f"{t.name} {pct}{size} {human_bytes(t.rate(now))}/s{tail}")
        width = self.width or shutil.get_terminal_size((100, 20)).columns - 1
        self._write("\r\x1b[K" + " | ".join(parts)[:width])
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
