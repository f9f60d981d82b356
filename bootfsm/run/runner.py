"""One provisioning run, end to end: the whole machine in a run session.

``execute`` is what `bootfsm run` (and the demo, and the tests) call. The session
(bootfsm/run/session.py) owns the lock, the journal, signals, the checkpoint and the
command events, as it does for `bake` and `fetch`; this module adds what only a node's
run does: the metrics textfile, the guest-agent (CSE) events and the OTLP export.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bootfsm import __version__
from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError, TransientError
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Outcome
from bootfsm.observe.liveness import boot_id
from bootfsm.run import metrics
from bootfsm.run.cse_events import CseEvents
from bootfsm.run.session import Session, SessionOptions, run_session

__all__ = ["RunOptions", "RunResult", "checkpoint_problem", "execute"]


@dataclass(frozen=True)
class RunOptions:
    """How to run: where the node is, what to print, how long to wait for the lock."""

    root: Path = Path("/")
    config_path: str = ""
    console: IO[str] | None = None
    console_json: bool = False
    wait_lock: float = 0.0
    env: Mapping[str, str] | None = None
    on_state: Callable[[str], None] | None = None
    on_status: Callable[[str], object] | None = None  # progress text within a state


@dataclass(frozen=True)
class RunResult:
    """The outcome, where its journal is, and the run's duration (``run.end``'s)."""

    outcome: Outcome
    run_id: str
    journal: Path | None
    duration_s: float = 0.0


CHECKPOINT_OUTCOMES = ("running", "done", "failed", "interrupted")


def checkpoint_problem(data: object) -> str:
    """What is wrong with the shape of checkpoint.json's parsed ``data`` ('' when nothing):
    the object the session writes (run_id, journal, pid, state, outcome; code and
    code_name once finished)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key in ("run_id", "journal", "state", "outcome"):
        if not isinstance(data.get(key), str):
            return f"{key!r} is not a string"
    if data["outcome"] not in CHECKPOINT_OUTCOMES:
        return f"unknown outcome {data['outcome'][:40]!r}"
    for key in ("pid", "code"):
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return f"{key!r} is not a non-negative integer"
    if not isinstance(data.get("code_name", ""), str):
        return "'code_name' is not a string"
    return ""


def execute(cfg: Config, opts: RunOptions) -> RunResult:
    """Run the machine on the node at ``opts.root``; never raises for node problems."""
    session = SessionOptions(
        kind="run",
        root=opts.root,
        config_path=opts.config_path,
        console=opts.console,
        console_json=opts.console_json,
        wait_lock=opts.wait_lock,
        env=opts.env,
        checkpoint=True,
    )
    r = run_session(cfg, session, lambda s: _machine(s, opts))
    return RunResult(r.outcome, r.run_id, r.journal, r.duration_s)


def _machine(s: Session, opts: RunOptions) -> Outcome:
    """The whole table, with the node's metrics and CSE events around it."""
    host, cfg, ctx = s.host, s.cfg, s.ctx
    ctx.status = opts.on_status
    this_boot = boot_id(host)
    for problem in metrics.publish_start(host, cfg, boot_id=this_boot, version=__version__):
        s.journal.event("warning", level="warning", message=problem)
    cse = CseEvents.from_config(host, cfg, s.run_id)

    def published(outcome: Outcome) -> list[str]:
        problems = cse.run_ended(outcome) + metrics.publish(host, cfg, s.path, s.run_id, outcome)
        if s.path is not None and any(k.startswith("OTEL_EXPORTER_OTLP") for k in host.env):
            problems += _export_trace(s.path, host.env)
        return problems

    s.after_end.append(published)

    def on_transition(src: str, dest: str, ended: Outcome | None) -> None:
        cse.state_ended(src, dest, ended)
        if opts.on_state is not None:
            opts.on_state(dest)

    outcome = s.drive(_registry(), _callbacks(), on_transition=on_transition)
    if outcome.code is Code.NO_GPU and cfg.detect.cleanup_on_no_gpu:
        _cleanup(ctx)  # in the run's own journal, before run.end
    return outcome


def _cleanup(ctx: Context) -> None:
    """detect.cleanup_on_no_gpu: a GPU image on a VM without a GPU removes what bootfsm
    installed (as `bootfsm uninstall`); the run still ends NO_GPU (22)."""
    from bootfsm.install import uninstall

    ctx.state, ctx.state_row, ctx.state_deadline = "uninstall", None, None
    try:
        uninstall.run(ctx)
    except (BootError, TransientError) as exc:
        ctx.warn(f"cleanup on NO_GPU failed ({exc.code.name}): {exc}")


def _export_trace(jpath: Path, env: Mapping[str, str]) -> list[str]:
    """Send the run to the OTLP endpoint the environment names (imported only then)."""
    from bootfsm.observe import otlp

    target = otlp.target_from_env(env)
    if target is None:
        return []
    try:
        with jpath.open(encoding="utf-8", errors="replace") as f:
            body = otlp.trace_request(otlp.events_from_lines(f), env)
    except (OSError, ValueError) as exc:
        return [f"OTLP export skipped: {exc}"]
    problem = otlp.export(target, body, env)
    return [p for p in (target.note, problem) if p]


def _registry() -> Mapping[str, Any]:
    from bootfsm.states import ahead

    return ahead()


def _callbacks() -> Mapping[str, Callable[[Context], None]]:
    from bootfsm.states import CALLBACKS

    return dict(CALLBACKS)
