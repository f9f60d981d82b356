"""The current or last run as Prometheus metrics, in a node_exporter textfile (docs/trace.md).

Written atomically at the start (so a killed run never leaves the last boot's success)
and at the end; every state in every file, no per-run label, so no series appears or
vanishes. A failure to write comes back as a message, never changing the outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.machine.engine import Outcome
from bootfsm.machine.table import STATES
from bootfsm.observe.trace import Span, TraceReport, load_run, unix_time

__all__ = ["OUTCOMES", "STATE_OUTCOMES", "publish", "publish_start", "textfile"]

#: Values of the ``outcome`` label (one-hot in ``bootfsm_run_outcome``).
OUTCOMES = ("running", "done", "failed", "interrupted")
#: Values of a state's ``outcome`` label (one-hot in ``bootfsm_state_outcome``).
STATE_OUTCOMES = ("not_run", "running", "done", "skipped", "failed", "interrupted")


def _label(value: object) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    v = float(value)
    if v != v:
        return "NaN"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _metric(name: str, help_: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {_num(v)}" for labels, v in samples]
    return lines


def textfile(r: TraceReport, *, now: float, started: float | None = None) -> str:
    """The exposition text of one run; ``now``: its end (its start while ``running``),
    ``started``: its start; both Unix time."""
    code = r.code if r.code is not None else -1
    running = r.outcome == "running"
    info = (
        f'{{version="{_label(r.version)}",outcome="{_label(r.outcome)}",'
        f'code_name="{_label(r.code_name)}",state="{_label(r.failed_state or r.outcome)}",'
        f'boot_id="{_label(r.boot_id)}"}}'
    )
    lines: list[str] = []
    lines += _metric("bootfsm_run_info", "Identity of the current or last run (1).", [(info, 1)])
    lines += _metric(
        "bootfsm_run_exit_code",
        "Exit code of the last run (0 provisioned; -1 while a run is in progress).",
        [("", code)],
    )
    lines += _metric(
        "bootfsm_run_success", "1 when the last run provisioned the node.", [("", r.code == 0)]
    )
    lines += _metric(
        "bootfsm_run_outcome",
        "Outcome of the current or last run, one-hot over " + ", ".join(OUTCOMES) + ".",
        [(f'{{outcome="{o}"}}', r.outcome == o) for o in OUTCOMES],
    )
    lines += _metric(
        "bootfsm_run_start_timestamp_seconds",
        "Unix time the current or last run started (compare with node_boot_time_seconds).",
        [("", round(started if started is not None else now - (r.duration_s or 0.0), 3))],
    )
    lines += _metric(
        "bootfsm_run_duration_seconds",
        "Wall time of the last run from start to its terminal event (0 while running).",
        [("", 0.0 if running else r.duration_s or 0.0)],
    )
    lines += _metric(
        "bootfsm_run_end_timestamp_seconds",
        "Unix time the last run ended (0 while a run is in progress).",
        [("", 0 if running else round(now, 3))],
    )
    lines += _metric(
        "bootfsm_run_retries",
        "Retries (back-offs) over all states of the last run.",
        [("", sum(len(s.retries) for s in r.spans))],
    )
    return "\n".join(lines + _state_metrics(r)) + "\n"


def _state_metrics(r: TraceReport) -> list[str]:
    """Every state of the table, then any other the run visited: one series each."""
    by_state = {s.state: s for s in r.spans}
    spans = [(name, by_state.get(name)) for name in [st.name for st in STATES]]
    spans += [(s.state, s) for s in r.spans if s.state not in {st.name for st in STATES}]

    def per_state(value: Callable[[Span], float]) -> list[tuple[str, float]]:
        return [(f'{{state="{_label(n)}"}}', value(sp) if sp else 0) for n, sp in spans]

    lines = _metric(
        "bootfsm_state_duration_seconds",
        "Seconds each state took in the last run (skipped states are ~0, not run 0).",
        per_state(lambda sp: sp.duration_s),
    )
    lines += _metric(
        "bootfsm_state_attempts",
        "Attempts of each state's action in the last run (0: skipped or not run).",
        per_state(lambda sp: sp.attempts),
    )
    lines += _metric(
        "bootfsm_state_retries",
        "Retries of each state in the last run.",
        per_state(lambda sp: len(sp.retries)),
    )
    lines += _metric(
        "bootfsm_state_outcome",
        "Outcome of each state, one-hot over " + ", ".join(STATE_OUTCOMES) + ".",
        [
            (
                f'{{state="{_label(n)}",outcome="{o}"}}',
                (sp.outcome if sp else "not_run") == o,
            )
            for n, sp in spans
            for o in STATE_OUTCOMES
        ],
    )
    return lines


def publish_start(host: Host, cfg: Config, *, boot_id: str, version: str) -> list[str]:
    """Write the textfile for a run that just started: outcome running, nothing run yet."""
    report = TraceReport(outcome="running", version=version, boot_id=boot_id)
    now = host.wall()
    return _write(host, cfg, textfile(report, now=now, started=now))


def _write(host: Host, cfg: Config, text: str) -> list[str]:
    target = cfg.run.metrics_file
    if not target:
        return []
    try:
        host.write_atomic(target, text, 0o644, durable=False)  # rewritten every run
    except (BootError, ValueError) as exc:
        return [f"metrics file {target} not written: {exc}"]
    return []


def publish(host: Host, cfg: Config, journal: Path | None, run_id: str, o: Outcome) -> list[str]:
    """Write the textfile for the run that just ended; problems come back as messages."""
    target = cfg.run.metrics_file
    if not target:
        return []
    report = load_run(journal) if journal is not None else TraceReport()
    if not report.run_id:  # no journal: the outcome alone
        report.run_id = run_id
    if report.outcome not in OUTCOMES or report.outcome == "running":
        report.outcome = "done" if o.ok else "failed"
    report.code, report.code_name = int(o.code), o.code.name
    if not o.ok:
        report.failed_state = o.state
    now = host.wall()
    started = unix_time(report.started)
    return _write(host, cfg, textfile(report, now=now, started=started))
