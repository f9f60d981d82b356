"""The run journal: structlog JSON lines, one file per run, durable where it matters.

Each event is one JSON object per line with ``ts`` (UTC), ``t`` (seconds since the run
started, monotonic), ``run_id`` and ``event``. Transitions and the terminal event are
fsynced (``durable=True``) so a crash or power loss never loses where the run was.
The console gets a short human rendering of the same events (colours only on a TTY).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

__all__ = ["CONSOLE_EVENTS", "Journal", "new_run_id"]

SCHEMA_VERSION = 1

#: Events echoed to the console; everything goes to the file.
CONSOLE_EVENTS = frozenset(
    {
        "run.start",
        "node.facts",
        "state.enter",
        "state.skip",
        "state.done",
        "state.retry",
        "state.failed",
        "run.end",
        "warning",
        "artifact.fetched",
    }
)


def new_run_id() -> str:
    """A short random run id (8 hex digits)."""
    return secrets.token_hex(4)


class _LineSink:
    """structlog 'logger' that appends rendered lines to a file and can fsync it."""

    def __init__(self, fh: IO[str] | None) -> None:
        self.fh = fh

    def msg(self, line: str) -> None:
        if self.fh is None:
            return
        try:
            self.fh.write(line + "\n")
            self.fh.flush()
        except OSError as exc:  # disk full: keep running, the console still speaks
            self.fh = None
            sys.stderr.write(f"bootfsm: journal write failed, continuing without: {exc}\n")

    info = debug = warning = error = critical = msg

    def sync(self) -> None:
        if self.fh is not None:
            with contextlib.suppress(OSError):
                os.fsync(self.fh.fileno())


class _ConsoleSink:
    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def msg(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    info = debug = warning = error = critical = msg


def _drop_private(_: Any, __: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if not k.startswith("_")}


class Journal:
    """Writes a run's events to ``path`` (JSON lines) and a human summary to the console."""

    def __init__(
        self,
        path: Path | None,
        *,
        run_id: str,
        console: IO[str] | None = None,
        console_json: bool = False,
        color: bool | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.run_id = run_id
        self._mono = monotonic
        self._t0 = monotonic()
        fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            fh = os.fdopen(fd, "a", encoding="utf-8")
        self._sink = _LineSink(fh)
        self._file_log = structlog.wrap_logger(
            self._sink,
            processors=[
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                _drop_private,
                structlog.processors.JSONRenderer(sort_keys=False, default=str),
            ],
        ).bind(run_id=run_id)
        self._console_log: Any = None
        if console is not None:
            # https://no-color.org: NO_COLOR set and not empty turns colour off
            use_color = (
                console.isatty() and not os.environ.get("NO_COLOR") if color is None else color
            )
            renderer: Any = (
                structlog.processors.JSONRenderer(default=str)
                if console_json
                else structlog.dev.ConsoleRenderer(colors=use_color, pad_event_to=16)
            )
            self._console_log = structlog.wrap_logger(
                _ConsoleSink(console),
                processors=[_drop_private, _console_fields, renderer],
            )

    def elapsed(self) -> float:
        """Seconds since the journal (the run) started."""
        return self._mono() - self._t0

    def event(
        self, event: str, *, durable: bool = False, level: str = "info", **fields: Any
    ) -> None:
        """Record one event; ``durable`` fsyncs the file before returning."""
        t = round(self.elapsed(), 4)
        getattr(self._file_log, level)(event, t=t, level=level, **fields)
        if durable:
            self._sink.sync()
        if self._console_log is not None and event in CONSOLE_EVENTS:
            getattr(self._console_log, level)(event, t=t, **fields)

    def close(self) -> None:
        """Flush, fsync and close the file."""
        self._sink.sync()
        if self._sink.fh is not None:
            self._sink.fh.close()
            self._sink.fh = None


_CONSOLE_KEEP = {
    "node.facts": ("arch", "os", "kernel", "gpu_count", "gpu_model", "nvswitches", "nvlink5"),
    "run.start": ("root", "deadline_s", "config_digest"),
}


def _console_fields(_: Any, __: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """Keep console lines short: drop bulky fields the file keeps."""
    keep = _CONSOLE_KEEP.get(event.get("event", ""))
    if keep is not None:
        return {
            "event": event["event"],
            "t": event.get("t"),
            **{k: event[k] for k in keep if k in event},
        }
    return {
        k: v for k, v in event.items() if k not in ("output", "detail", "argv_full", "guards_all")
    }
