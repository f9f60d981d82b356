"""Reading journals back: ``parse_events``, the one reader, folds lines into a ``TraceReport``.

Forgiving: torn or garbage lines, unknown or older events give warnings, never a traceback.
``render`` is the text, ``to_json`` the stable form (docs/trace.md), trace_html the picture."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from bootfsm.observe.trace_fold import Folder, unix_time
from bootfsm.observe.trace_model import TRACE_SCHEMA, Mark, Span, TraceReport, scrub
from bootfsm.observe.trace_view import render_text as render
from bootfsm.observe.trace_view import report_json as to_json

__all__ = [
    "TRACE_SCHEMA",
    "Mark",
    "Span",
    "TraceReport",
    "journals",
    "latest_journal",
    "load_run",
    "parse_events",
    "render",
    "scrub",
    "to_json",
    "unix_time",
]


_KEY = '"event": "'
_DECODE = json.JSONDecoder().raw_decode


def _decode(line: str) -> dict[str, Any]:
    """One event object (raw_decode skips json.loads' layers; leading blanks fall back)."""
    try:
        ev, end = _DECODE(line)
    except ValueError:
        ev, end = json.loads(line), len(line)
    if not isinstance(ev, dict) or "event" not in ev or line[end:].strip():
        raise ValueError("not an event object")
    return ev


def _other_kind(line: str, kinds: Collection[str]) -> bool:
    """The line names an event kind outside ``kinds`` (found without decoding it)."""
    i = line.rfind(_KEY)
    j = line.find('"', i + len(_KEY)) if i >= 0 else -1
    return j > 0 and line[i + len(_KEY) : j] not in kinds


def parse_events(
    lines: Iterable[str],
    source: str = "journal",
    kinds: Collection[str] | None = None,
    *,
    marks: bool = False,
) -> TraceReport:
    """Fold journal lines into a report; bad lines become warnings, never exceptions.

    ``kinds`` (the fleet's lean read): decode only those, count the rest, sum bad lines in one
    warning. ``marks``: keep every folded event in ``report.marks`` too (the OTLP view)."""
    folder = Folder(source, marks=marks)
    r = folder.report
    for n, ev in _events(lines, r, kinds):
        if kinds is not None and not (isinstance(ev["event"], str) and ev["event"] in kinds):
            r.events += 1
            continue
        try:
            folder.add(ev)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            r.bad_lines += 1
            if kinds is None:
                r.warnings.append(
                    f"{source}:{n}: event {ev.get('event')!r} unreadable ({exc}); skipped"
                )
    folder.finish()
    if kinds is not None and r.bad_lines:
        r.warnings.append(f"{source}: {r.bad_lines} unreadable line(s) skipped")
    return r


def _events(
    lines: Iterable[str], r: TraceReport, kinds: Collection[str] | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, event) of ``lines``; other kinds and bad lines are counted in ``r``."""
    bad: list[int] = []
    n = 0
    for n, line in enumerate(lines, 1):
        if kinds is not None and _other_kind(line, kinds):
            r.events += 1
            continue
        if not line.strip():
            continue
        try:
            ev = _decode(line)
        except ValueError:
            r.bad_lines += 1
            if kinds is None:
                bad.append(n)
            continue
        yield n, ev
    for b in bad:
        what = "torn last line (crash or power loss?)" if b == n else "not a JSON event"
        r.warnings.append(f"{r.source}:{b}: {what}; skipped")


def load_run(path: Path) -> TraceReport:
    """Parse one journal file (missing or unreadable gives a report with a warning)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            report = parse_events(fh, source=path.name)
        report.journal_path = str(path)
        return report
    except OSError as exc:
        r = TraceReport(source=path.name, outcome="unknown")
        r.warnings.append(f"{path}: {exc.strerror or exc}")
        return r


def journals(log_dir: Path) -> list[Path]:
    """Run journals in ``log_dir``, oldest first (names sort by start time)."""
    return sorted(log_dir.glob("run-*.jsonl"))


def latest_journal(log_dir: Path) -> Path | None:
    """The newest run journal in ``log_dir``."""
    runs = journals(log_dir)
    return runs[-1] if runs else None
