"""The one fold: a journal's decoded events, in order, into the ``TraceReport`` views read."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from bootfsm.observe.trace_model import Mark, Span, TraceReport, scrub

#: Newest journal schema (``run.start.schema``) this reader knows.
JOURNAL_SCHEMA = 1
#: Characters of command output kept in a report.
TAIL_CHARS = 1500
#: Fields every event has, left out of ``Mark.fields``.
MARK_SKIP = frozenset({"t", "ts", "event", "level", "state", "run_id"})
#: A command's mark leaves its output out (up to 2000 characters each; the report keeps
#: each state's last command's in ``state_last_command``).
_COMMAND_SKIP = MARK_SKIP | {"output"}


def _num(value: Any, default: float) -> float:
    """A finite float, else ``default`` (JSON allows Infinity and NaN; times do not)."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return v if math.isfinite(v) else default


def unix_time(ts: Any) -> float | None:
    """Seconds since the epoch of an ISO 8601 timestamp (None when it is not one)."""
    if not isinstance(ts, str) or not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None


class Folder:
    """Folds decoded events, in journal order, into a ``TraceReport``."""

    def __init__(self, source: str = "journal", *, marks: bool = False) -> None:
        self.report = TraceReport(source=source)
        self.marks = marks  # keep each event as a Mark (the OTLP view needs them)
        self._t0_wall: float | None = None
        self._no_time = 0

    # -- time --------------------------------------------------------------------------
    def _time(self, ev: dict[str, Any]) -> float:
        """``t`` of the event; older journals without it get ``ts`` minus the first ``ts``."""
        t = ev.get("t")
        if t is not None:
            return _num(t, self.report.last_t)
        wall = unix_time(ev.get("ts"))
        if wall is not None:
            if self._t0_wall is None:
                self._t0_wall = wall
            return round(wall - self._t0_wall, 4)
        self._no_time += 1
        return self.report.last_t

    def _open(self, state: str, t: float) -> Span:
        spans = self.report.spans
        if spans and spans[-1].state == state and spans[-1].outcome == "running":
            return spans[-1]
        if spans and spans[-1].outcome == "running":  # an older journal without a close event
            spans[-1].outcome = "done"
            spans[-1].duration_s = round(t - spans[-1].start_t, 4)
        s = Span(state, t)
        spans.append(s)
        return s

    def _state(self, ev: dict[str, Any]) -> str:
        st = ev.get("state")
        if isinstance(st, str) and st:
            return st
        spans = self.report.spans
        return spans[-1].state if spans else "?"

    # -- events ------------------------------------------------------------------------
    def add(self, ev: dict[str, Any]) -> None:
        """Apply one event; raises TypeError/ValueError for an unreadable field."""
        r = self.report
        r.events += 1
        t = self._time(ev)
        r.last_t = max(r.last_t, t)
        kind = ev.get("event")
        kind = kind if isinstance(kind, str) else ""
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, ev, t)
        if self.marks:
            self._mark(ev, kind, t)

    def _mark(self, ev: dict[str, Any], kind: str, t: float) -> None:
        """Keep the event, tied to the span it happened in: a state event to its state's,
        another to the state entered and running (a postcondition check's to the run)."""
        spans = self.report.spans
        last = len(spans) - 1 if spans else None
        if last is not None and kind not in ("run.start", "run.end"):
            s = spans[last]
            in_span = kind.startswith("state.") or (s.entered and s.outcome == "running")
        else:
            in_span = False
        skip = _COMMAND_SKIP if kind == "command" else MARK_SKIP
        fields = {k: v for k, v in ev.items() if k not in skip}
        self.report.marks.append(Mark(t, kind, last if in_span else None, fields))

    def _run_start(self, ev: dict[str, Any], t: float) -> None:
        r = self.report
        r.start_t = t
        r.run_id = str(ev.get("run_id", ""))
        r.run_kind = str(ev.get("kind") or "run")
        r.started = str(ev.get("ts", ""))
        r.version = str(ev.get("version", ""))
        r.config_digest = str(ev.get("config_digest", ""))
        r.root = str(ev.get("root", ""))
        r.boot_id = str(ev.get("boot_id") or "")
        pid = ev.get("pid")
        r.pid = pid if isinstance(pid, int) else None
        schema = ev.get("schema")
        r.journal_schema = schema if isinstance(schema, int) else None
        if r.journal_schema is not None and r.journal_schema > JOURNAL_SCHEMA:
            r.warnings.append(
                f"{r.source}: journal schema {r.journal_schema} is newer than this reader "
                f"({JOURNAL_SCHEMA}); fields it does not know are ignored"
            )

    def _facts(self, ev: dict[str, Any], t: float) -> None:
        self.report.facts = {k: v for k, v in ev.items() if k not in MARK_SKIP}

    def _enter(self, ev: dict[str, Any], t: float) -> None:
        s = self._open(self._state(ev), t)
        s.entered = True
        if "attempts_max" in ev:
            s.attempts_max = int(ev["attempts_max"])
        if "time_limit_s" in ev:
            s.time_limit_s = _num(ev["time_limit_s"], 0.0)

    def _attempt(self, ev: dict[str, Any], t: float) -> None:
        s = self._open(self._state(ev), t)
        s.entered = True
        s.attempts = max(s.attempts + (0 if "attempt" in ev else 1), int(ev.get("attempt", 0)))

    def _skip(self, ev: dict[str, Any], t: float) -> None:
        s = self._open(self._state(ev), t)
        s.outcome = "skipped"
        s.duration_s = round(t - s.start_t, 4)

    def _retry(self, ev: dict[str, Any], t: float) -> None:
        s = self._open(self._state(ev), t)
        s.entered = True
        sleep = _num(ev.get("sleep_s"), 0.0)
        s.sleep_s = round(s.sleep_s + sleep, 4)
        s.retries.append(
            {
                "t": t,
                "attempt": ev.get("attempt"),
                "sleep_s": sleep,
                "code": str(ev.get("code", "")),
                "error": scrub(str(ev.get("error", ""))),
            }
        )

    def _done(self, ev: dict[str, Any], t: float) -> None:
        s = self._open(self._state(ev), t)
        s.outcome = "done"
        s.duration_s = round(_num(ev.get("duration_s"), t - s.start_t), 4)
        if "attempts" in ev:
            s.attempts = max(s.attempts, int(ev["attempts"]))

    def _failed(self, ev: dict[str, Any], t: float) -> None:
        r = self.report
        s = self._open(self._state(ev), t)
        s.outcome = "failed"
        s.duration_s = round(t - s.start_t, 4)
        s.settle_attempts()
        r.failed_state = s.state
        code = ev.get("code")
        r.code = code if isinstance(code, int) else r.code
        r.code_name = str(ev.get("code_name", ""))
        r.message = scrub(str(ev.get("message", "")))
        r.hint = str(ev.get("hint", ""))
        detail = ev.get("detail")
        r.detail = dict(detail) if isinstance(detail, dict) else {}
        if "traceback" in ev:
            r.detail["traceback"] = str(ev["traceback"])
        r.failure_output = scrub(str(ev.get("output", "") or ""))[-TAIL_CHARS:]

    def _command(self, ev: dict[str, Any], t: float) -> None:
        r = self.report
        state = self._state(ev)
        rc = ev.get("rc")
        timed_out = bool(ev.get("timed_out"))
        # a probe's non-zero answer is expected (package not installed yet...): no fault
        probe = bool(ev.get("probe")) and not timed_out
        dur = _num(ev.get("duration_s"), 0.0)
        cmd = {
            "t": round(t - dur, 4),
            "state": state,
            "argv": [scrub(str(a)) for a in ev.get("argv") or []],
            "rc": rc,
            "duration_s": dur,
            "timed_out": timed_out,
            "probe": probe,
        }
        self._count_command(cmd, bool(ev.get("state")), timed_out or (rc != 0 and not probe))
        r.commands.append(cmd)
        output = scrub(str(ev.get("output", "") or ""))[-TAIL_CHARS:]
        r.state_last_command[state] = {**cmd, "output": output}

    def _count_command(self, cmd: dict[str, Any], named: bool, bad: bool) -> None:
        """The command counts in its state's span; a command that names a state not
        entered yet (a postcondition check runs before state.enter or state.skip) opens it."""
        spans, state = self.report.spans, cmd["state"]
        if named and all(s.state != state for s in spans):
            self._open(state, cmd["t"])
        if spans and spans[-1].state == state:
            spans[-1].commands += 1
            spans[-1].failed_commands += int(bad)

    def _transition(self, ev: dict[str, Any], t: float) -> None:
        r = self.report
        guards = ev.get("guards")
        src = str(ev.get("source", ""))
        r.transitions.append(
            {
                "t": t,
                "source": src,
                "dest": str(ev.get("dest", "")),
                "trigger": str(ev.get("trigger", "")),
                "guards": dict(guards) if isinstance(guards, dict) else {},
            }
        )
        last = r.spans[-1] if r.spans else None
        if last is not None and last.outcome == "running" and src == last.state:
            last.outcome = "done"
            last.duration_s = round(t - last.start_t, 4)

    def _note(self, ev: dict[str, Any], t: float) -> None:
        self.report.notes.append(
            {"t": t, "state": self._state(ev), "message": scrub(str(ev.get("message", "")))}
        )

    def _interrupted(self, ev: dict[str, Any], t: float) -> None:
        cmd = ev.get("command") or []
        what = f" while running {' '.join(map(str, cmd))[:200]}" if cmd else ""
        msg = f"interrupted by {ev.get('signal', 'a signal')}{what}"
        self.report.notes.append({"t": t, "state": self._state(ev), "message": scrub(msg)})

    def _run_end(self, ev: dict[str, Any], t: float) -> None:
        r = self.report
        r.outcome = str(ev.get("outcome", "unknown"))
        r.ended = str(ev.get("ts", ""))
        r.end_t = r.end_t if r.end_t is not None else r.last_t
        code = ev.get("code")
        r.code = code if isinstance(code, int) else r.code
        r.code_name = str(ev.get("code_name", r.code_name))
        r.duration_s = _num(ev.get("duration_s"), t)
        if r.outcome != "done":
            r.failed_state = str(ev.get("state") or r.failed_state)
            r.message = scrub(str(ev.get("message", r.message)))
            r.hint = str(ev.get("hint", r.hint))
        last = r.spans[-1] if r.spans else None
        if last is not None and last.outcome == "running":
            last.outcome = "interrupted" if r.outcome == "interrupted" else last.outcome
            last.duration_s = round(t - last.start_t, 4)
            last.settle_attempts()

    # -- end ---------------------------------------------------------------------------
    def finish(self) -> TraceReport:
        """Close open spans, add the warnings a reader needs, return the report."""
        r = self.report
        if self._no_time:
            r.warnings.append(
                f"{r.source}: {self._no_time} event(s) carry no time (t or ts); "
                "their durations are unknown and shown as 0"
            )
        if r.events == 0:
            r.outcome = "unknown"
            r.warnings.append(f"{r.source}: no events")
            return r
        if r.outcome == "running":
            for s in r.spans:
                if s.outcome == "running":
                    s.duration_s = round(r.last_t - s.start_t, 4)
                    s.settle_attempts()
            r.duration_s = r.last_t
            r.warnings.append(
                f"{r.source}: no run.end event: the run is still in progress or was killed"
            )
        if not r.run_id:
            r.warnings.append(f"{r.source}: no run.start event (older or truncated journal)")
        return r


_HANDLERS = {
    "run.start": Folder._run_start,
    "node.facts": Folder._facts,
    "state.enter": Folder._enter,
    "state.attempt": Folder._attempt,
    "state.skip": Folder._skip,
    "state.retry": Folder._retry,
    "state.done": Folder._done,
    "state.failed": Folder._failed,
    "command": Folder._command,
    "transition": Folder._transition,
    "warning": Folder._note,
    "run.interrupted": Folder._interrupted,
    "run.end": Folder._run_end,
}
