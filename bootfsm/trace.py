"""Reading journals back: events in, a run's story out (timeline, root cause, facts).

``parse_events`` is pure and forgiving: a torn last line (crash), garbage lines, an
empty journal or unknown events give warnings, never a traceback. ``render`` makes the
one-screen text a person on call reads; ``to_json`` is the stable machine form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Span", "TraceReport", "latest_journal", "load_run", "parse_events", "render", "to_json"]

TRACE_SCHEMA = 1


@dataclass
class Span:
    """One state's time in a run."""

    state: str
    start_t: float
    duration_s: float = 0.0
    attempts: int = 0
    outcome: str = "running"  # done | skipped | failed | running
    retries: list[dict[str, Any]] = field(default_factory=list)
    commands: int = 0


@dataclass
class TraceReport:
    """Everything a postmortem needs from one journal."""

    run_id: str = ""
    started: str = ""
    version: str = ""
    config_digest: str = ""
    root: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "running"  # done | failed | interrupted | running | unknown
    code: int | None = None
    code_name: str = ""
    failed_state: str = ""
    message: str = ""
    hint: str = ""
    duration_s: float | None = None
    last_command: dict[str, Any] | None = None
    failure_output: str = ""
    warnings: list[str] = field(default_factory=list)
    events: int = 0


def _span(report: TraceReport, state: str, t: float) -> Span:
    if report.spans and report.spans[-1].state == state and report.spans[-1].outcome == "running":
        return report.spans[-1]
    s = Span(state, t)
    report.spans.append(s)
    return s


def _apply(report: TraceReport, ev: dict[str, Any]) -> None:
    kind = ev.get("event")
    t = float(ev.get("t", 0.0) or 0.0)
    state = str(ev.get("state", ""))
    if kind == "run.start":
        report.run_id = str(ev.get("run_id", ""))
        report.started = str(ev.get("ts", ""))
        report.version = str(ev.get("version", ""))
        report.config_digest = str(ev.get("config_digest", ""))
        report.root = str(ev.get("root", ""))
    elif kind == "node.facts":
        report.facts = {
            k: v for k, v in ev.items() if k not in ("event", "t", "ts", "run_id", "level")
        }
    elif kind == "state.skip":
        s = _span(report, state, t)
        s.outcome = "skipped"
    elif kind in ("state.enter", "state.attempt"):
        s = _span(report, state, t)
        if kind == "state.attempt":
            s.attempts = max(s.attempts, int(ev.get("attempt", 1)))
    elif kind == "state.retry":
        s = _span(report, state, t)
        s.retries.append({k: ev.get(k) for k in ("attempt", "sleep_s", "error", "code")})
    elif kind == "state.done":
        s = _span(report, state, t)
        s.outcome = "done"
        s.duration_s = float(ev.get("duration_s", t - s.start_t))
    elif kind == "state.failed":
        s = _span(report, state, t)
        s.outcome = "failed"
        s.duration_s = round(t - s.start_t, 4)
        report.failed_state = state
        report.code = ev.get("code")
        report.code_name = str(ev.get("code_name", ""))
        report.message = str(ev.get("message", ""))
        report.hint = str(ev.get("hint", ""))
        report.failure_output = str(ev.get("output", ""))
    elif kind == "command":
        if report.spans:
            report.spans[-1].commands += 1
        report.last_command = {
            k: ev.get(k) for k in ("state", "argv", "rc", "duration_s", "timed_out", "output")
        }
    elif kind == "transition":
        report.transitions.append(
            {k: ev.get(k) for k in ("source", "dest", "trigger", "guards", "t")}
        )
        if (
            report.spans
            and report.spans[-1].outcome == "running"
            and ev.get("source") == report.spans[-1].state
        ):
            report.spans[-1].outcome = "done"
    elif kind == "run.end":
        report.outcome = str(ev.get("outcome", "unknown"))
        report.code = ev.get("code", report.code)
        report.code_name = str(ev.get("code_name", report.code_name))
        report.duration_s = ev.get("duration_s")
        if report.outcome != "done":
            report.failed_state = str(ev.get("state", report.failed_state))
            report.message = str(ev.get("message", report.message))
            report.hint = str(ev.get("hint", report.hint))
        if (
            report.outcome == "interrupted"
            and report.spans
            and report.spans[-1].outcome == "running"
        ):
            report.spans[-1].outcome = "interrupted"


def parse_events(lines: Iterable[str], source: str = "journal") -> TraceReport:
    """Fold journal lines into a report; bad lines become warnings."""
    report = TraceReport()
    last_t = 0.0
    pending_bad: list[int] = []
    n = 0
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            ev = json.loads(text)
            if not isinstance(ev, dict) or "event" not in ev:
                raise ValueError("not an event object")
        except ValueError:
            pending_bad.append(n)
            continue
        report.events += 1
        try:
            last_t = float(ev.get("t", last_t) or last_t)
            _apply(report, ev)
        except (TypeError, ValueError) as exc:
            report.warnings.append(f"{source}:{n}: event {ev.get('event')!r} unreadable: {exc}")
    for bad in pending_bad:
        what = "torn last line (crash or power loss?)" if bad == n else "not a JSON event"
        report.warnings.append(f"{source}:{bad}: {what}; skipped")
    if report.events == 0:
        report.outcome = "unknown"
        report.warnings.append(f"{source}: no events")
        return report
    if report.outcome == "running":
        for s in report.spans:
            if s.outcome == "running":
                s.duration_s = round(last_t - s.start_t, 4)
        report.duration_s = last_t
        report.warnings.append(
            f"{source}: no run.end event: the run is still in progress or was killed"
        )
    if not report.run_id:
        report.warnings.append(f"{source}: no run.start event (older or truncated journal)")
    return report


def load_run(path: Path) -> TraceReport:
    """Parse one journal file (missing or unreadable gives a report with a warning)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return parse_events(fh, source=path.name)
    except OSError as exc:
        r = TraceReport(outcome="unknown")
        r.warnings.append(f"{path}: {exc.strerror or exc}")
        return r


def latest_journal(log_dir: Path) -> Path | None:
    """The newest run journal in ``log_dir`` (names sort by start time)."""
    runs = sorted(log_dir.glob("run-*.jsonl"))
    return runs[-1] if runs else None


def to_json(report: TraceReport) -> dict[str, Any]:
    """The stable JSON form (schema documented in docs/trace.md)."""
    data = asdict(report)
    data["schema"] = TRACE_SCHEMA
    return data


def _fmt_guards(guards: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (guards or {}).items()) or "-"


def render(report: TraceReport) -> str:
    """One screen: header, node, timeline, root cause."""
    out: list[str] = []
    head = {"done": "OK", "failed": "FAILED", "interrupted": "INTERRUPTED"}.get(
        report.outcome, report.outcome.upper()
    )
    dur = f"{report.duration_s:.2f} s" if report.duration_s is not None else "?"
    code = f" code {report.code} {report.code_name}" if report.code not in (None, 0) else ""
    out.append(f"run {report.run_id or '?'}  {report.started}  {head}{code}  ({dur})")
    f = report.facts
    if f:
        out.append(
            f"node  {f.get('arch')} {f.get('os')} kernel {f.get('kernel')}  "
            f"{f.get('gpu_count')}x {f.get('gpu_model')}  nvswitches={f.get('nvswitches')} "
            f"nvlink5={f.get('nvlink5')} vm={f.get('vm_size') or '-'}"
        )
    out.append("")
    out.append("  start   state     duration  attempts  outcome")
    for s in report.spans:
        out.append(
            f"  {s.start_t:6.2f}  {s.state:<8}  {s.duration_s:7.2f}s  "
            f"{s.attempts or '-':>8}  {s.outcome}"
        )
        for r in s.retries:
            out.append(
                f"          retry after attempt {r.get('attempt')}: {r.get('code')} "
                f"{r.get('error')} (slept {r.get('sleep_s')} s)"
            )
    chosen = [t for t in report.transitions if t.get("guards")]
    if chosen:
        out.append("")
        for t in chosen:
            out.append(f"  {t['source']} -> {t['dest']}  guards: {_fmt_guards(t.get('guards'))}")
    if report.outcome not in ("done",) and (report.failed_state or report.code_name):
        out += ["", "root cause"]
        out.append(f"  state:   {report.failed_state or '-'}")
        out.append(f"  code:    {report.code} {report.code_name}")
        out.append(f"  message: {report.message}")
        out.append(f"  hint:    {report.hint}")
        lc = report.last_command
        if lc:
            out.append(
                f"  last command: {' '.join(map(str, lc.get('argv') or []))} -> rc {lc.get('rc')}"
                + (" (timed out)" if lc.get("timed_out") else "")
            )
            tail = (report.failure_output or lc.get("output") or "").strip().splitlines()[-6:]
            out += [f"    | {line}" for line in tail]
    for w in report.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out) + "\n"
