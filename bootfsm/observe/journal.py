"""The run journal: one JSON-lines file per run (structlog) and a short console rendering.

Every event has ``ts`` (UTC), ``t`` (monotonic seconds since start), ``run_id`` and ``event``;
``durable=True`` events are fsynced; every string is redacted before it is written. Under
journald (``$JOURNAL_STREAM``) console lines become structured entries (host/journald.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

from bootfsm.core.redact import redact_text
from bootfsm.host import journald

__all__ = ["CONSOLE_EVENTS", "Journal", "new_run_id"]

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
        "driver.progress",
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
    """The console stream; under journald, native entries (or ``<N>`` lines) instead."""

    def __init__(self, stream: IO[str], native: journald.Journald | None = None) -> None:
        self.stream = stream
        self.native = native
        self.fields: dict[str, object] = {}  # journald fields of the line being written
        self.level = "info"

    def msg(self, line: str) -> None:
        if self.native is not None:
            if self.native.send({"MESSAGE": line, **self.fields}):
                return
            line = journald.prefixed(self.level, line)
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    info = debug = warning = error = critical = msg


def _drop_private(_: Any, __: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    return {k: _redacted(v) for k, v in event.items() if not k.startswith("_")}


def _redacted(value: Any) -> Any:
    """``value`` with every string in it passed through ``redact_text``: no event writes a token."""
    if isinstance(value, str):
        return redact_text(value) if ("=" in value or "://" in value) else value
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value


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
        env: Mapping[str, str] | None = None,
        native: journald.Journald | None = None,
    ) -> None:
        """``env`` enables journald entries when its ``JOURNAL_STREAM`` is ``console``."""
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
        # events also come from helper threads (the driver build's progress watcher):
        # one lock keeps every line whole
        self._lock = threading.Lock()
        self._console_log: Any = None
        self._console_sink: _ConsoleSink | None = None
        if console is not None:
            to_journald = env is not None and _is_journal_stream(console, env)
            if color is None:  # https://no-color.org: NO_COLOR set and not empty turns it off
                color = console.isatty() and not os.environ.get("NO_COLOR")
            color = color and not to_journald
            renderer: Any = (
                structlog.processors.JSONRenderer(default=str)
                if console_json
                else structlog.dev.ConsoleRenderer(colors=color, pad_event_to=16)
            )
            self._console_sink = _ConsoleSink(
                console, (native or journald.Journald()) if to_journald else None
            )
            self._console_log = structlog.wrap_logger(
                self._console_sink,
                processors=[_drop_private, _console_fields, renderer],
            )

    def elapsed(self) -> float:
        """Seconds since the journal (the run) started."""
        return self._mono() - self._t0

    def event(
        self, event: str, *, durable: bool = False, level: str = "info", **fields: Any
    ) -> None:
        """Record one event; ``durable`` fsyncs the file before returning."""
        with self._lock:
            t = round(self.elapsed(), 4)
            getattr(self._file_log, level)(event, t=t, level=level, **fields)
            if durable:
                self._sink.sync()
            if self._console_log is not None and event in CONSOLE_EVENTS:
                if self._console_sink is not None and self._console_sink.native is not None:
                    self._console_sink.level = level
                    self._console_sink.fields = self._journald_fields(event, level, fields)
                getattr(self._console_log, level)(event, t=t, **fields)

    def _journald_fields(
        self, event: str, level: str, fields: Mapping[str, Any]
    ) -> dict[str, object]:
        """PRIORITY, SYSLOG_IDENTIFIER and the fields `journalctl` matches on."""
        out: dict[str, object] = {
            "PRIORITY": journald.priority(level),
            "SYSLOG_IDENTIFIER": "bootfsm",
            "BOOTFSM_EVENT": event,
            "RUN_ID": self.run_id,
            "STATE": fields.get("state") or None,
        }
        code = _code_of(fields.get("code"), fields.get("code_name"))
        if code is not None:
            out["CODE"], out["CODE_NAME"] = code.value, code.name
        return out

    def close(self) -> None:
        """Flush, fsync and close the file (and the journald socket)."""
        if self._console_sink is not None and self._console_sink.native is not None:
            self._console_sink.native.close()
        self._sink.sync()
        if self._sink.fh is not None:
            self._sink.fh.close()
            self._sink.fh = None


def _is_journal_stream(stream: IO[str], env: Mapping[str, str]) -> bool:
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # StringIO, closed stream
        return False
    return journald.stream_matches(env.get("JOURNAL_STREAM"), fd)


def _code_of(code: object, name: object) -> Any:
    """The Code an event names by number (``code=31``) or name (``code=CHECKSUM_...``)."""
    from bootfsm.core.codes import Code

    for v in (code, name):
        if isinstance(v, int) and not isinstance(v, bool):
            try:
                return Code(v)
            except ValueError:
                continue
        if isinstance(v, str) and v in Code.__members__:
            return Code[v]
    return None


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
