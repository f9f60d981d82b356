"""Views of a ``TraceReport``: root cause, blame, the stable JSON (docs/trace.md), the text."""

from __future__ import annotations

from typing import Any

from bootfsm.observe.trace_model import TRACE_SCHEMA, Span, TraceReport

__all__ = ["blame", "guard_rows", "render_text", "report_json", "root_cause"]

_KILLED_HINT = "rerun `bootfsm run`; it resumes at the first unsatisfied state"


def blame(report: TraceReport) -> list[dict[str, Any]]:
    """States by time spent, longest first, with their share of the run."""
    total = report.duration_s or sum(s.duration_s for s in report.spans) or 0.0
    rows = [
        {
            "state": s.state,
            "duration_s": s.duration_s,
            "share": round(min(1.0, max(0.0, s.duration_s / total)), 4) if total > 0 else 0.0,
            "outcome": s.outcome,
        }
        for s in report.spans
    ]
    return sorted(rows, key=lambda r: (-r["duration_s"], r["state"]))


def _command_of(report: TraceReport, state: str) -> dict[str, Any] | None:
    """The command that failed the state (from the error), else the state's last command."""
    d, last = report.detail, report.state_last_command.get(state)
    if isinstance(d.get("argv"), list) and "returncode" in d:
        seen = last or {}
        same = seen.get("argv") == d["argv"]  # the journal has the failed command's timing
        return {
            "argv": [str(a) for a in d["argv"]],
            "rc": d["returncode"],
            "duration_s": seen.get("duration_s") if same else None,
            "timed_out": same and bool(seen.get("timed_out")),
            "output_tail": report.failure_output or str(seen.get("output", "")),
            "caused_failure": True,
        }
    if last is None:
        return None
    cmd = {k: last[k] for k in ("argv", "rc", "duration_s", "timed_out")}
    return {**cmd, "output_tail": str(last.get("output", "")), "caused_failure": False}


def _verdict(report: TraceReport, state: str) -> tuple[int | None, str, str, str] | None:
    """Code, name, hint and message of a failed or dead run; None if nothing to explain."""
    if report.outcome in ("done", "unknown"):
        return None
    if report.outcome not in ("killed", "running"):
        return report.code, report.code_name, report.hint, report.message
    if report.code is not None:
        # state.failed was recorded, the run died before run.end: the verdict stands
        died = f"{report.message} (the run died before recording its end)"
        return report.code, report.code_name, report.hint, died
    if report.outcome == "running" and report.alive is not False:
        return None
    lost = (
        f"the run ended without a verdict during state {state or '?'} "
        f"(last event at {report.last_t:.2f} s): killed, crashed or the node lost power"
    )
    return None, "", _KILLED_HINT, lost


def root_cause(report: TraceReport) -> dict[str, Any] | None:
    """What failed, why and what to do; None for a provisioned or still running run."""
    state = report.failed_state or (report.spans[-1].state if report.spans else "")
    verdict = _verdict(report, state)
    if verdict is None:
        return None
    code, name, hint, message = verdict
    span = report.span(state)
    detail = dict(report.detail)
    detail.pop("output", None)  # the command's output_tail has it
    return {
        "state": state,
        "code": code,
        "code_name": name,
        "message": message,
        "hint": hint,
        "path": [s.state for s in report.spans],
        "guards": {
            f"{t['source']} -> {t['dest']}": dict(t["guards"])
            for t in report.transitions
            if t.get("guards")
        },
        "command": _command_of(report, state),
        "retries": list(span.retries) if span else [],
        "notes": [n for n in report.notes if n.get("state") == state],
        "detail": detail,
    }


def _span_json(s: Span) -> dict[str, Any]:
    return {
        "state": s.state,
        "start_s": s.start_t,
        "duration_s": s.duration_s,
        "end_s": s.end_t,
        "attempts": s.attempts,
        "attempts_max": s.attempts_max,
        "time_limit_s": s.time_limit_s,
        "outcome": s.outcome,
        "retries": list(s.retries),
        "sleep_s": s.sleep_s,
        "commands": s.commands,
        "failed_commands": s.failed_commands,
    }


def report_json(r: TraceReport) -> dict[str, Any]:
    """The stable JSON form of one run (docs/trace.md, "bootfsm trace --json")."""
    return {
        "schema": TRACE_SCHEMA,
        "kind": "run",
        "source": r.source,
        "run_id": r.run_id,
        "run_kind": r.run_kind,
        "started": r.started,
        "ended": r.ended,
        "version": r.version,
        "journal_schema": r.journal_schema,
        "config_digest": r.config_digest,
        "root": r.root,
        "pid": r.pid,
        "boot_id": r.boot_id,
        "outcome": r.outcome,
        "alive": r.alive,
        "code": r.code,
        "code_name": r.code_name,
        "failed_state": r.failed_state if r.outcome != "done" else "",
        "message": r.message,
        "hint": r.hint,
        "duration_s": r.duration_s,
        "facts": dict(r.facts),
        "states": [_span_json(s) for s in r.spans],
        "blame": blame(r),
        "transitions": list(r.transitions),
        "root_cause": root_cause(r),
        "commands": list(r.commands),
        "notes": list(r.notes),
        "warnings": list(r.warnings),
        "events": r.events,
    }


def guard_rows(rc: dict[str, Any]) -> list[tuple[str, str]]:
    """The root cause's guard values: ("guards", "edge: name=value, ...") per edge."""
    return [("guards", f"{edge}: {_values(g)}") for edge, g in rc["guards"].items()]


def _values(guards: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in guards.items())


# -- text ------------------------------------------------------------------------------
_HEAD = {"done": "OK", "failed": "FAILED", "interrupted": "INTERRUPTED", "killed": "KILLED"}


def _clip(text: str, width: int = 150) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _argv(argv: list[str]) -> str:
    if not argv:
        return "-"
    head = argv[0].rsplit("/", 1)[-1] if "/" in argv[0] else argv[0]
    return _clip(" ".join([head, *argv[1:]]), 120)


def _header(r: TraceReport) -> list[str]:
    head = _HEAD.get(r.outcome, r.outcome.upper())
    if r.outcome == "running":
        head = "IN PROGRESS" if r.alive else "RUNNING?"
    dur = f"{r.duration_s:.2f} s" if r.duration_s is not None else "?"
    code = f" code {r.code} {r.code_name}" if r.code not in (None, 0) else ""
    out = [f"{r.run_kind} {r.run_id or '?'}  {r.started or '?'}  {head}{code}  ({dur})"]
    f = r.facts
    if f:
        out.append(
            f"node  {f.get('arch')} {f.get('os')} kernel {f.get('kernel')}  "
            f"{f.get('gpu_count')}x {f.get('gpu_model')}  nvswitches={f.get('nvswitches')} "
            f"nvlink5={f.get('nvlink5')} vm={f.get('vm_size') or '-'}"
        )
    return out


def _timeline(r: TraceReport) -> list[str]:
    out = ["", "  start    state     duration  attempts  outcome"]
    for s in r.spans:
        tries = f"{s.attempts or '-'}" + (f"/{s.attempts_max}" if s.attempts_max else "")
        extra = ""
        if s.retries:
            n = len(s.retries)
            extra = f"  {n} retr{'y' if n == 1 else 'ies'}, slept {s.sleep_s:.2f} s"
        out.append(
            f"  {s.start_t:7.2f}  {s.state:<8}  {s.duration_s:7.2f}s  {tries:>8}  "
            f"{s.outcome}{extra}"
        )
        for rt in s.retries:
            out.append(
                f"           retry after attempt {rt.get('attempt')}: {rt.get('code')} "
                f"{_clip(str(rt.get('error')), 90)} (slept {rt.get('sleep_s')} s)"
            )
    return out


def _blame(r: TraceReport) -> list[str]:
    rows = [b for b in blame(r) if b["duration_s"] > 0][:6]
    if not rows:
        return []
    out = ["", "blame (longest first)"]
    for b in rows:
        bar = "#" * max(1, round(b["share"] * 30)) if b["share"] > 0 else ""
        out.append(f"  {b['state']:<8} {b['duration_s']:8.2f}s  {b['share'] * 100:5.1f}%  {bar}")
    return out


def _root(r: TraceReport) -> list[str]:
    rc = root_cause(r)
    if rc is None:
        if r.outcome == "running" and r.spans:
            s = r.spans[-1]
            return ["", f"in progress: state {s.state} for {s.duration_s:.1f} s"]
        return []
    out = ["", "root cause"] + [f"  {k + ':':<10}{v}" for k, v in _root_rows(rc)]
    return out + _command_lines(rc["command"])


def _root_rows(rc: dict[str, Any]) -> list[tuple[str, str]]:
    """The root cause as (term, text): what failed, then the way there."""
    code = f"{rc['code']} {rc['code_name']}" if rc["code"] is not None else "- (no verdict)"
    rows = [
        ("state", f"{rc['state'] or '-'}   (path {' -> '.join(rc['path']) or '-'})"),
        ("code", code),
        ("message", _clip((rc["message"].splitlines() or [""])[0])),
        ("hint", rc["hint"]),
    ]
    rows += guard_rows(rc)
    rows += [
        (
            "retry",
            f"attempt {rt.get('attempt')} at {rt.get('t', 0):.2f} s: {rt.get('code')} "
            f"{_clip(str(rt.get('error')), 80)} (slept {rt.get('sleep_s')} s)",
        )
        for rt in rc["retries"]
    ]
    return rows + [("note", f"at {n['t']:.2f} s: {_clip(n['message'], 110)}") for n in rc["notes"]]


def _command_lines(cmd: dict[str, Any] | None) -> list[str]:
    """The command that failed the state (or its last one) and its output's last lines."""
    if not cmd:
        return []
    label = "failed command" if cmd["caused_failure"] else "last command"
    flags = " (timed out)" if cmd["timed_out"] else ""
    tail = str(cmd["output_tail"] or "").strip().splitlines()[-6:]
    return [f"  {label}: {_argv(cmd['argv'])} -> exit {cmd['rc']}{flags}"] + [
        f"    | {_clip(line, 140)}" for line in tail
    ]


def render_text(r: TraceReport) -> str:
    """One screen: header, node, timeline, blame, root cause, warnings."""
    out = _header(r) + _timeline(r)
    chosen = [t for t in r.transitions if t.get("guards")]
    if chosen and r.outcome == "done":
        out.append("")
        for t in chosen:
            out.append(f"  {t['source']} -> {t['dest']}  guards: {_values(t['guards'])}")
    out += _blame(r) + _root(r)
    out += [f"warning: {w}" for w in r.warnings]
    return "\n".join(out) + "\n"
