"""A run's trace as data: ``Mark`` per event, ``Span`` per state, ``TraceReport`` per journal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bootfsm.core.redact import redact_urls as scrub  # every URL's credentials and query

__all__ = ["TRACE_SCHEMA", "Mark", "Span", "TraceReport", "scrub"]

#: Version of the JSON that ``to_json`` returns (docs/trace.md).
TRACE_SCHEMA = 1


@dataclass
class Mark:
    """One folded event: ``span`` indexes ``TraceReport.spans`` (None: the run itself);
    ``fields`` leaves out ``trace_fold.MARK_SKIP``."""

    t: float
    event: str
    span: int | None
    fields: dict[str, Any]


@dataclass
class Span:
    """One state's time in a run (start and duration in seconds since the run started)."""

    state: str
    start_t: float
    duration_s: float = 0.0
    attempts: int = 0
    attempts_max: int | None = None
    time_limit_s: float | None = None
    outcome: str = "running"  # done | skipped | failed | interrupted | running
    retries: list[dict[str, Any]] = field(default_factory=list)
    sleep_s: float = 0.0
    commands: int = 0
    failed_commands: int = 0
    entered: bool = False  # its action started (state.enter / attempt / retry seen)

    def settle_attempts(self) -> None:
        """Attempts of an entered span without ``state.attempt`` events: retries + 1."""
        if self.entered:
            self.attempts = max(self.attempts, len(self.retries) + 1)

    @property
    def end_t(self) -> float:
        """When the span ended (or the last event seen, while running)."""
        return round(self.start_t + self.duration_s, 4)


@dataclass
class TraceReport:
    """Everything a postmortem needs from one journal."""

    source: str = ""
    journal_path: str = ""  # the file read (load_run), for "see the journal" hints
    run_id: str = ""
    run_kind: str = "run"  # run.start's kind: run, bake, fetch
    started: str = ""
    ended: str = ""
    version: str = ""
    journal_schema: int | None = None
    config_digest: str = ""
    root: str = ""
    pid: int | None = None
    boot_id: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "running"  # done | failed | interrupted | running | killed | unknown
    alive: bool | None = None
    code: int | None = None
    code_name: str = ""
    failed_state: str = ""
    message: str = ""
    hint: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    state_last_command: dict[str, dict[str, Any]] = field(default_factory=dict)
    commands: list[dict[str, Any]] = field(default_factory=list)
    failure_output: str = ""
    notes: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    events: int = 0
    bad_lines: int = 0  # lines that are not a readable event
    last_t: float = 0.0
    start_t: float = 0.0  # run.start's t
    end_t: float | None = None  # the latest t seen at run.end (None: no run.end)
    marks: list[Mark] = field(default_factory=list)  # every event, when asked for (OTLP)

    def span(self, state: str) -> Span | None:
        """The last span of ``state`` (None when it never ran)."""
        for s in reversed(self.spans):
            if s.state == state:
                return s
        return None
