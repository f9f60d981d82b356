"""The last run as Prometheus metrics, in a node_exporter textfile-collector file.

At the end of every run (``run.metrics_file``, empty disables) the runner calls
``publish``: it reads the run's journal back, renders the text exposition format
(``# HELP``/``# TYPE`` then samples; every metric a gauge describing the LAST run) and
writes it atomically, so node_exporter never reads half a file. docs/trace.md lists
the metrics. A failure to write is returned as a message (the runner journals it as a
warning); it never changes the run's outcome.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bootfsm.config import Config
from bootfsm.engine import Outcome
from bootfsm.errors import BootError
from bootfsm.host import Host
from bootfsm.trace import TraceReport, load_run

__all__ = ["OUTCOMES", "publish", "textfile"]

#: Values of the ``outcome`` label (one-hot in ``bootfsm_run_outcome``).
OUTCOMES = ("done", "failed", "interrupted")


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


def textfile(r: TraceReport, *, now: float) -> str:
    """The exposition text of one finished run (``now``: the wall time it ended)."""
    code = r.code if r.code is not None else -1
    info = (
        f'{{run_id="{_label(r.run_id)}",version="{_label(r.version)}",'
        f'outcome="{_label(r.outcome)}",code_name="{_label(r.code_name)}",'
        f'state="{_label(r.failed_state or "done")}"}}'
    )
    lines: list[str] = []
    lines += _metric("bootfsm_run_info", "Identity of the last run (always 1).", [(info, 1)])
    lines += _metric(
        "bootfsm_run_exit_code",
        "Exit code of the last run (0 provisioned; see bootfsm codes).",
        [("", code)],
    )
    lines += _metric(
        "bootfsm_run_success", "1 when the last run provisioned the node.", [("", r.code == 0)]
    )
    lines += _metric(
        "bootfsm_run_outcome",
        "Outcome of the last run, one-hot over done, failed and interrupted.",
        [(f'{{outcome="{o}"}}', r.outcome == o) for o in OUTCOMES],
    )
    lines += _metric(
        "bootfsm_run_duration_seconds",
        "Wall time of the last run from start to its terminal event.",
        [("", r.duration_s or 0.0)],
    )
    lines += _metric(
        "bootfsm_run_end_timestamp_seconds",
        "Unix time the last run ended.",
        [("", round(now, 3))],
    )
    lines += _metric(
        "bootfsm_run_retries",
        "Retries (back-offs) over all states of the last run.",
        [("", sum(len(s.retries) for s in r.spans))],
    )
    spans = r.spans
    lines += _metric(
        "bootfsm_state_duration_seconds",
        "Seconds each state took in the last run (skipped states are ~0).",
        [(f'{{state="{_label(s.state)}"}}', s.duration_s) for s in spans],
    )
    lines += _metric(
        "bootfsm_state_attempts",
        "Attempts of each state's action in the last run (0: skipped).",
        [(f'{{state="{_label(s.state)}"}}', s.attempts) for s in spans],
    )
    lines += _metric(
        "bootfsm_state_retries",
        "Retries of each state in the last run.",
        [(f'{{state="{_label(s.state)}"}}', len(s.retries)) for s in spans],
    )
    lines += _metric(
        "bootfsm_state_outcome",
        "Outcome of each state in the last run (done, skipped, failed, interrupted).",
        [(f'{{state="{_label(s.state)}",outcome="{_label(s.outcome)}"}}', 1) for s in spans],
    )
    return "\n".join(lines) + "\n"


def publish(host: Host, cfg: Config, journal: Path | None, run_id: str, o: Outcome) -> list[str]:
    """Write the textfile for the run that just ended; problems come back as messages."""
    target = cfg.run.metrics_file
    if not target:
        return []
    report = load_run(journal) if journal is not None else TraceReport()
    if not report.run_id:  # no journal: the outcome alone
        report.run_id = run_id
    if report.outcome not in OUTCOMES:
        report.outcome = "done" if o.ok else "failed"
    report.code, report.code_name = int(o.code), o.code.name
    if not o.ok:
        report.failed_state = o.state
    try:
        host.write_atomic(target, textfile(report, now=host.wall()), 0o644)
    except (BootError, ValueError) as exc:
        return [f"metrics file {target} not written: {exc}"]
    return []
