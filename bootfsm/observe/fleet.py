"""The fleet view: where many nodes lose their boots, read from their collected journals.

``scan`` streams the journals under a directory one at a time; what it keeps grows with
distinct keys and finished spans (8 bytes each, for exact percentiles), not with events.
docs/trace.md ("The fleet view") says what a node is and which journals are left out."""

from __future__ import annotations

import heapq
import math
import os
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootfsm.observe.trace import Span, TraceReport, parse_events

__all__ = [
    "FLEET_EVENTS",
    "FLEET_SCHEMA",
    "FleetStats",
    "iter_journals",
    "percentile",
    "render_fleet",
    "scan",
]

FLEET_SCHEMA = 1
#: The event kinds the fleet view decodes; every other kind is only counted.
FLEET_EVENTS = frozenset(
    {
        "run.start",
        "node.facts",
        "state.enter",
        "state.skip",
        "state.retry",
        "state.done",
        "state.failed",
        "run.end",
    }
)
_FINISHED = ("done", "failed")
_MAX_SAMPLES = 10


def _ranked(counts: Counter[Any]) -> list[tuple[Any, int]]:
    """Most first; a tie by key."""
    return sorted(counts.items(), key=lambda x: (-x[1], x[0]))


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


NOT_BOOTS = ("bake-", "fetch-", "uninstall-")
"""Journal name prefixes of the run session's other kinds (bootfsm/run/session.py)."""


def iter_journals(root: Path) -> Iterator[tuple[str, Path]]:
    """(node, journal) pairs under ``root`` in a stable order, one directory at a time."""
    for node, path, _ in _walk(str(root), "", None, set()):
        yield node, Path(path)


def _walk(
    d: str, rel: str, node: str | None, stack: set[tuple[int, int]]
) -> Iterator[tuple[str, str, str]]:
    """(node, path, path relative to the root) below ``d``; a symlink loop is not followed."""
    try:
        st = os.stat(d)
        # name order: run-<time>-<id>.jsonl sorts by start, as add_run needs
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError:
        return
    here = (st.st_dev, st.st_ino)
    if here in stack:
        return
    stack.add(here)
    for e in entries:
        if e.is_dir():
            yield from _walk(e.path, rel + e.name + "/", node or e.name, stack)
        elif _boot_journal(e, node):
            yield (node or e.name[: -len(".jsonl")], e.path, rel + e.name)
    stack.discard(here)


def _boot_journal(e: os.DirEntry[str], node: str | None) -> bool:
    """A journal file, but not an image build's bake or fetch journal in a node's directory."""
    return (
        e.name.endswith(".jsonl")
        and e.is_file()
        and not (node is not None and e.name.startswith(NOT_BOOTS))
    )


@dataclass
class FleetStats:
    """Aggregates of a fleet, fed one run at a time; a node's runs together, oldest first."""

    top: int = 10
    files: int = 0
    nodes: int = 0
    runs: int = 0
    events: int = 0
    bad_lines: int = 0
    run_outcomes: Counter[str] = field(default_factory=Counter)
    node_outcomes: Counter[str] = field(default_factory=Counter)
    recovered: int = 0
    failures_by_code: Counter[tuple[int, str]] = field(default_factory=Counter)
    failures_by_state: Counter[str] = field(default_factory=Counter)
    failures_by_state_code: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: dict[str, array[float]] = field(default_factory=dict)
    run_durations: array[float] = field(default_factory=lambda: array("d"))
    skipped: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    retries: Counter[tuple[str, str]] = field(default_factory=Counter)
    retry_runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    retry_sleep: dict[tuple[str, str], float] = field(default_factory=dict)
    retry_example: dict[tuple[str, str], str] = field(default_factory=dict)
    models: dict[str, Counter[str]] = field(default_factory=dict)
    slowest: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    warned_files: int = 0
    _node: str | None = None
    _node_runs: list[str] = field(default_factory=list)

    def add_run(self, node: str, r: TraceReport) -> None:
        """Count one run of ``node`` (runs of one node must arrive together, oldest first)."""
        if node != self._node:
            self.end_node()
            self._node = node
        outcome = "unfinished" if r.outcome == "running" else r.outcome
        self.runs += 1
        self._node_runs.append(outcome)
        self.run_outcomes[outcome] += 1
        self._count_failure(outcome, r)
        for s in r.spans:
            self._count_span(s)
        model = str(r.facts.get("gpu_model") or "?")
        self.models.setdefault(model, Counter())[outcome] += 1
        if r.outcome != "running" and r.duration_s is not None:
            self.run_durations.append(float(r.duration_s))
            heapq.heappush(
                self.slowest, (float(r.duration_s), node, r.run_id, outcome, r.code_name)
            )
            if len(self.slowest) > self.top:
                heapq.heappop(self.slowest)  # keep the ``top`` slowest
        if r.warnings:
            self.warned_files += 1
            room = _MAX_SAMPLES - len(self.samples)
            self.samples.extend(r.warnings[: max(0, room)])

    def _count_failure(self, outcome: str, r: TraceReport) -> None:
        """A failed or interrupted run with a verdict: by code, by state and by both."""
        if outcome not in ("failed", "interrupted") or r.code is None:
            return
        state = r.failed_state or "?"
        self.failures_by_code[(r.code, r.code_name)] += 1
        self.failures_by_state[state] += 1
        self.failures_by_state_code[(state, r.code_name)] += 1

    def _count_span(self, s: Span) -> None:
        """One state of a run: skipped, or its attempts, duration and retries."""
        if s.outcome == "skipped":
            self.skipped[s.state] += 1
            return
        self.attempts[s.state] += s.attempts
        if s.outcome in _FINISHED:
            self.durations.setdefault(s.state, array("d")).append(s.duration_s)
        seen: set[tuple[str, str]] = set()
        for rt in s.retries:
            key = (s.state, str(rt.get("code", "")))
            self.retries[key] += 1
            sleep = float(rt.get("sleep_s") or 0.0)
            self.retry_sleep[key] = self.retry_sleep.get(key, 0.0) + sleep
            self.retry_example.setdefault(key, str(rt.get("error", ""))[:160])
            seen.add(key)
        for key in seen:
            self.retry_runs[key] += 1

    def end_node(self) -> None:
        """Close the current node: its final outcome is that of its last run."""
        if self._node is None:
            return
        self.nodes += 1
        final = self._node_runs[-1]
        self.node_outcomes[final] += 1
        if final == "done" and any(o != "done" for o in self._node_runs[:-1]):
            self.recovered += 1
        self._node, self._node_runs = None, []

    def state_percentiles(self) -> dict[str, dict[str, Any]]:
        """count, p50, p95 and max of finished span durations per state, and of whole runs."""
        out: dict[str, dict[str, Any]] = {}
        items = [*self.durations.items(), ("(run)", self.run_durations)]
        for state, values in items:
            v = sorted(values)
            out[state] = {
                "count": len(v),
                "p50": percentile(v, 50),
                "p95": percentile(v, 95),
                "max": v[-1] if v else None,
                "skipped": self.skipped.get(state, 0),
                "attempts": self.attempts.get(state, 0),
            }
        return out

    def to_json(self, source: str, seconds: float) -> dict[str, Any]:
        """The stable JSON form (docs/trace.md, "bootfsm trace --fleet --json")."""
        return {
            "schema": FLEET_SCHEMA,
            "kind": "fleet",
            "source": source,
            "seconds": round(seconds, 3),
            "files": self.files,
            "nodes": self.nodes,
            "runs": self.runs,
            "events": self.events,
            "bad_lines": self.bad_lines,
            "node_outcomes": dict(sorted(self.node_outcomes.items())),
            "run_outcomes": dict(sorted(self.run_outcomes.items())),
            "recovered_nodes": self.recovered,
            "failures_by_code": [
                {"code": c, "code_name": n, "runs": k}
                for (c, n), k in _ranked(self.failures_by_code)
            ],
            "failures_by_state": [
                {"state": s, "runs": k} for s, k in _ranked(self.failures_by_state)
            ],
            "failures_by_state_code": [
                {"state": s, "code_name": n, "runs": k}
                for (s, n), k in _ranked(self.failures_by_state_code)
            ],
            "durations": self.state_percentiles(),
            "slowest": [
                {"node": n, "run_id": i, "duration_s": d, "outcome": o, "code_name": c}
                for d, n, i, o, c in sorted(self.slowest, reverse=True)
            ],
            "retry_hotspots": [
                {
                    "state": s,
                    "code_name": c,
                    "retries": k,
                    "runs": self.retry_runs[(s, c)],
                    "sleep_s": round(self.retry_sleep.get((s, c), 0.0), 3),
                    "example": self.retry_example.get((s, c), ""),
                }
                for (s, c), k in _ranked(self.retries)
            ],
            "models": {m: dict(sorted(c.items())) for m, c in sorted(self.models.items())},
            "warned_files": self.warned_files,
            "warnings": list(self.samples),
        }


def scan(root: Path, *, top: int = 10) -> FleetStats:
    """Stream every journal under ``root`` into a ``FleetStats``."""
    stats = FleetStats(top=top)
    for node, path, rel in _walk(str(root), "", None, set()):
        try:  # read line by line: memory per journal is one line
            with open(path, encoding="utf-8", errors="replace") as fh:
                report = parse_events(fh, rel, kinds=FLEET_EVENTS)
        except OSError as exc:
            stats.warned_files += 1
            if len(stats.samples) < _MAX_SAMPLES:
                stats.samples.append(f"{rel}: unreadable: {exc.strerror or exc}")
            continue
        stats.files += 1
        stats.events += report.events
        stats.bad_lines += report.bad_lines
        stats.add_run(node, report)
    stats.end_node()
    return stats


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole else "    -"


def _s(v: float | None) -> str:
    return f"{v:8.2f}" if v is not None else "       -"


def _failures(data: dict[str, Any]) -> list[str]:
    """Failed runs by code (with a bar) and by state; nothing when none failed."""
    failed = sum(f["runs"] for f in data["failures_by_code"])
    if not failed:
        return []
    out = ["", "failures by code"]
    for f in data["failures_by_code"][:12]:
        bar = "#" * max(1, round(30 * f["runs"] / failed))
        name = f"{f['code']} {f['code_name']}"
        out.append(f"  {name:<32} {f['runs']:6}  {_pct(f['runs'], failed)}  {bar}")
    out += ["", "failures by state"]
    return out + [
        f"  {f['state']:<10} {f['runs']:6}  {_pct(f['runs'], failed)}"
        for f in data["failures_by_state"]
    ]


def _slowest(data: dict[str, Any]) -> list[str]:
    """The slowest runs, slowest first; nothing when no run finished."""
    out = ["", "slowest runs"] if data["slowest"] else []
    for r in data["slowest"]:
        code = "" if r["code_name"] in ("", "OK") else f" {r['code_name']}"
        out.append(
            f"  {r['node']:<24} run {r['run_id'] or '?':<8} {r['duration_s']:9.2f} s  "
            f"{r['outcome']}{code}"
        )
    return out


def render_fleet(data: dict[str, Any]) -> str:
    """The fleet screen from ``FleetStats.to_json`` output."""
    n, runs = data["nodes"], data["runs"]
    out = [
        f"fleet {data['source']}: {n} nodes, {runs} runs, {data['events']} events "
        f"({data['files']} journals, {data['bad_lines']} unreadable lines) in {data['seconds']} s"
    ]
    outs = "  ".join(f"{k} {v} ({_pct(v, n).strip()})" for k, v in data["node_outcomes"].items())
    out.append(f"nodes   {outs or '-'}")
    out.append(f"        recovered after an earlier failed run: {data['recovered_nodes']}")
    out.append("runs    " + "  ".join(f"{k} {v}" for k, v in data["run_outcomes"].items()))
    out += _failures(data)
    out += ["", "durations (finished spans, s)        n       p50       p95       max  skipped"]
    for state, d in data["durations"].items():
        out.append(
            f"  {state:<28} {d['count']:7}  {_s(d['p50'])}  {_s(d['p95'])}  {_s(d['max'])}"
            f"  {d['skipped']:7}"
        )
    out += _slowest(data)
    if data["retry_hotspots"]:
        out += ["", "retry hot spots"]
        for h in data["retry_hotspots"][:8]:
            out.append(
                f"  {h['state']:<8} {h['code_name']:<28} {h['retries']:6} retries in "
                f"{h['runs']} runs, slept {h['sleep_s']:.1f} s  e.g. {h['example'][:60]}"
            )
    if data["warnings"]:
        out += ["", f"warnings ({data['warned_files']} journals; first {len(data['warnings'])}):"]
        out += [f"  {w}" for w in data["warnings"]]
    return "\n".join(out) + "\n"
