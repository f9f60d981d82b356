"""`bootfsm trace`: the story of one run (default: the latest; as text, JSON, HTML or
OTLP), of a node's runs (``--history``), or of a fleet's journals (``--fleet DIR``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bootfsm.commands.common import load_or_exit
from bootfsm.observe.liveness import annotate
from bootfsm.observe.trace import TRACE_SCHEMA, TraceReport, journals, latest_journal, load_run

__all__ = ["history_json", "main", "render_history"]

NOTHING = 1


def _find(target: str | None, log_dir: Path) -> Path | None:
    if target is None:
        return latest_journal(log_dir)
    p = Path(target)
    if p.is_file():
        return p
    for kind in ("run", "bake", "fetch", "uninstall"):  # the session's journal kinds, a run's first
        matches = sorted(log_dir.glob(f"{kind}-*{target}*.jsonl"))
        if matches:
            return matches[-1]
    return None


def _load(path: Path, log_dir: Path, state_dir: Path) -> TraceReport:
    report = load_run(path)
    local = path.resolve().parent == log_dir.resolve()
    # liveness only means something for this node's own journals
    return annotate(report, state_dir / "lock") if local else report


def _between(prev: TraceReport, cur: TraceReport) -> str:
    if prev.boot_id and cur.boot_id:
        return "reboot" if prev.boot_id != cur.boot_id else "rerun (same boot)"
    return "then"


def _where(r: TraceReport) -> str:
    """The state a run failed in, else (killed or still running) its last open span's."""
    if r.failed_state:
        return r.failed_state
    open_ = ("running", "interrupted")  # interrupted: liveness.annotate of a killed run
    return next((s.state for s in reversed(r.spans) if s.outcome in open_), "")


def history_json(reports: list[TraceReport]) -> dict[str, Any]:
    """The runs of one node, oldest first, and the story they tell."""
    runs = []
    for i, r in enumerate(reports):
        runs.append(
            {
                "run_id": r.run_id,
                "source": r.source,
                "started": r.started,
                "duration_s": r.duration_s,
                "outcome": r.outcome,
                "code": r.code,
                "code_name": r.code_name,
                "state": _where(r) if r.outcome != "done" else "",
                "boot_id": r.boot_id,
                "retries": sum(len(s.retries) for s in r.spans),
                "after": _between(reports[i - 1], r) if i else "",
                "warnings": len(r.warnings),
            }
        )
    story = ""
    for rep, row in zip(reports, runs, strict=True):
        step = rep.outcome
        if rep.outcome not in ("done", "running"):
            step += f" ({rep.code_name or 'no verdict'} in {row['state'] or '?'})"
        story += (f" -> {row['after']} -> " if row["after"] else "") + step
    return {"schema": TRACE_SCHEMA, "kind": "history", "runs": runs, "story": story}


def render_history(data: dict[str, Any], where: str) -> str:
    """The history screen."""
    runs = data["runs"]
    out = [f"history of {where}: {len(runs)} run(s), oldest first", ""]
    out.append("  started                      run       duration  outcome      code / state")
    for r in runs:
        if r["after"]:
            out.append(f"    -- {r['after']} --")
        out.append(_history_row(r))
    out += ["", f"story: {data['story'].strip() or '-'}"]
    return "\n".join(out) + "\n"


def _history_row(r: dict[str, Any]) -> str:
    """One run's line: start, id, duration, outcome, and what failed where."""
    dur = f"{r['duration_s']:8.2f} s" if r["duration_s"] is not None else "       ? "
    code = "-" if r["code"] is None else r["code"]
    verdict = "" if r["outcome"] == "done" else f"{code} {r['code_name']}"
    where_ = f" in {r['state']}" if r["state"] else ""
    retries = f"  ({r['retries']} retries)" if r["retries"] else ""
    return (
        f"  {r['started'] or '?':<28} {r['run_id'] or '?':<8}  {dur}  {r['outcome']:<11}  "
        f"{verdict}{where_}{retries}"
    )


def _fleet(args: argparse.Namespace) -> int:
    from bootfsm.observe.fleet import render_fleet, scan

    root = Path(args.fleet)
    if not root.is_dir():
        print(f"bootfsm: fleet directory {root} does not exist", file=sys.stderr)
        return NOTHING
    t0 = time.monotonic()
    stats = scan(root, top=args.top)
    data = stats.to_json(str(root), time.monotonic() - t0)
    if stats.files == 0:
        print(f"bootfsm: no *.jsonl journals under {root}", file=sys.stderr)
        return NOTHING
    print(json.dumps(data, indent=1) if args.json else render_fleet(data), end="\n" * args.json)
    return 0


def _history(log_dir: Path, state_dir: Path, as_json: bool) -> int:
    paths = journals(log_dir)
    if not paths:
        print(f"bootfsm: no journal found in {log_dir}", file=sys.stderr)
        return NOTHING
    reports = [_load(p, log_dir, state_dir) for p in paths]
    data = history_json(reports)
    print(
        json.dumps(data, indent=1, default=str) if as_json else render_history(data, str(log_dir))
    )
    return 0


def _otlp(path: Path, where: str) -> int:
    """Convert one journal to OTLP/JSON: a file, or one POST to a collector."""
    import os

    from bootfsm.core.errors import BootError
    from bootfsm.host.host import Host
    from bootfsm.observe import otlp

    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            body = otlp.trace_request(otlp.events_from_lines(f), os.environ)
    except (OSError, ValueError) as exc:
        print(f"bootfsm: cannot convert {path}: {exc}", file=sys.stderr)
        return NOTHING
    if where.startswith(("http://", "https://")):
        problem = otlp.export(otlp.target_for(where, os.environ), body, os.environ)
        if problem:
            print(f"bootfsm: {problem}", file=sys.stderr)
            return NOTHING
        spans = len(body["resourceSpans"][0]["scopeSpans"][0]["spans"])
        print(f"bootfsm: sent {spans} spans of {path.name} to {where}", file=sys.stderr)
        return 0
    out = Path(where).absolute()
    try:
        Host(Path("/")).write_atomic(str(out), json.dumps(body, indent=1) + "\n", 0o644)
    except (BootError, OSError) as exc:
        print(f"bootfsm: cannot write {out}: {exc}", file=sys.stderr)
        return NOTHING
    print(f"bootfsm: wrote {out} (OTLP/JSON, {path.name})", file=sys.stderr)
    return 0


def _html(report: TraceReport, out: Path) -> int:
    """Write the run's page to ``out``."""
    from bootfsm.observe.trace_html import render_html

    try:
        out.write_text(render_html(report), encoding="utf-8")
    except OSError as exc:
        print(f"bootfsm: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return NOTHING
    print(f"bootfsm: wrote {out} (run {report.run_id or '?'}, {report.outcome})", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    """Dispatch to the run, history or fleet view."""
    if getattr(args, "fleet", None):
        return _fleet(args)
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    log_dir, state_dir = (
        Path(args.root) / d.lstrip("/") for d in (cfg.run.log_dir, cfg.run.state_dir)
    )
    if getattr(args, "history", False):
        return _history(log_dir, state_dir, args.json)
    path = _find(args.target, log_dir)
    if path is None:
        what = f"no journal matching {args.target!r}" if args.target else "no journal"
        print(f"bootfsm: {what} found in {log_dir}", file=sys.stderr)
        return NOTHING
    if getattr(args, "otlp", None):
        return _otlp(path, args.otlp)
    report = _load(path, log_dir, state_dir)
    if getattr(args, "html", None):
        return _html(report, Path(args.html))
    from bootfsm.observe.trace import render, to_json

    if args.json:
        print(json.dumps(to_json(report), indent=1, default=str))
    else:
        print(render(report), end="")
    return 0
