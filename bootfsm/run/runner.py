"""One provisioning run, end to end: the whole machine in a run session (``execute``),
plus what only a node's run does: metrics textfile, guest-agent events, OTLP export."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from bootfsm import __version__
from bootfsm.core import caller
from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.config_files import DROPIN_DIR
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.host import Host
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Outcome
from bootfsm.observe.liveness import boot_id
from bootfsm.run import metrics
from bootfsm.run.cse_events import CseEvents
from bootfsm.run.session import Session, SessionOptions, SessionResult, run_session

__all__ = ["RunOptions", "checkpoint_problem", "execute"]


@dataclass(frozen=True)
class RunOptions(SessionOptions):
    """The session's options (kind and checkpoint set by ``execute``) and a run's own."""

    on_state: Callable[[str], object] | None = None
    on_status: Callable[[str], object] | None = None  # progress text within a state
    hook: bool = False  # `run --hook`: the provisioning hook (docs/provisioning-hook.md)
    overrides: tuple[caller.Override, ...] = ()  # what the hook set over the config
    config_sources: Mapping[str, str] | None = None  # "section.key" -> the file that set it
    cse_budget: Mapping[str, object] | None = None  # the hook under CSE's clock: run.start's
    budget_spent: str = ""  # why the hook must not start the GPU step (CSE's budget is spent)


CHECKPOINT_OUTCOMES = ("running", "done", "failed", "interrupted")


def checkpoint_problem(data: object) -> str:
    """What is wrong with the shape of checkpoint.json's parsed ``data`` ('' when nothing)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for key in ("run_id", "journal", "state", "outcome"):
        if not isinstance(data.get(key), str):
            return f"{key!r} is not a string"
    if data["outcome"] not in CHECKPOINT_OUTCOMES:
        return f"unknown outcome {data['outcome'][:40]!r}"
    for key in ("pid", "code"):
        v = data.get(key)
        if v is not None and (type(v) is not int or v < 0):  # a bool is no count
            return f"{key!r} is not a non-negative integer"
    if not isinstance(data.get("code_name", ""), str):
        return "'code_name' is not a string"
    return ""


def execute(cfg: Config, opts: RunOptions) -> SessionResult:
    """Run the machine on the node at ``opts.root``; never raises for node problems."""
    # where each configured value came from: its file, or what the hook set it from
    sources = {**(opts.config_sources or {}), **{o.key: o.source for o in opts.overrides}}
    fields: dict[str, object] = {"hook": opts.hook, "config_sources": sources}
    if opts.cse_budget is not None:
        fields["cse_budget"] = dict(opts.cse_budget)
    session = replace(opts, kind="run", checkpoint=True, start_fields=fields)
    return run_session(cfg, session, lambda s: _machine(s, opts))


def _persist_caller(s: Session, opts: RunOptions) -> None:
    """`run --hook`: keep the caller's choices for later runs as a drop-in beside the
    config file; rewritten only when they changed."""
    root, config = opts.root.resolve(), Path(opts.config_path).resolve()
    if not config.is_relative_to(root) or not any(o.persist for o in opts.overrides):
        return
    from bootfsm.install import records

    config_dir = ("/" + str(config.relative_to(root))).rsplit("/", 1)[0]  # a node path
    path = f"{config_dir}/{DROPIN_DIR}/{caller.HOOK_DROPIN}"
    text = caller.dropin_text(opts.overrides, s.run_id)
    if _settings(s.host.read_text(path)) != _settings(text):
        s.host.makedirs(path.rsplit("/", 1)[0])
        records.write_file(s.ctx, path, text, 0o644)
        s.journal.event(
            "hook.persisted",
            durable=True,
            path=path,
            keys=[o.key for o in opts.overrides if o.persist],
        )


def _settings(text: str | None) -> list[str]:
    """A drop-in's lines without its comments (the header names the run that wrote it)."""
    return [ln for ln in (text or "").splitlines() if not ln.startswith("#")]


def _reboot_note(host: Host, outcome: Outcome) -> Outcome:
    """A run that provisioned but asked the caller for a reboot says so in its message."""
    request = host.read_text(caller.REBOOT_REQUEST) if outcome.ok else None
    if not request:
        return outcome
    return Outcome(
        outcome.code, outcome.state, f"{outcome.message}; reboot required: {request.strip()}"
    )


def _machine(s: Session, opts: RunOptions) -> Outcome:
    """The whole table, with the node's metrics and CSE events around it."""
    from bootfsm.states import CALLBACKS, REGISTRY

    host, cfg, ctx = s.host, s.cfg, s.ctx
    ctx.status = opts.on_status
    for problem in metrics.publish_start(host, cfg, boot_id=boot_id(host), version=__version__):
        s.journal.event("warning", level="warning", message=problem)
    cse = CseEvents(host, cfg.run.cse_events_dir, s.run_id)

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

    if opts.hook:
        _persist_caller(s, opts)
    if opts.budget_spent:  # end now, with the summary line, rather than be killed mid-install
        return Outcome(Code.DEADLINE_EXCEEDED, "", opts.budget_spent)
    outcome = _reboot_note(host, s.drive(REGISTRY, CALLBACKS, on_transition=on_transition))
    facts = ctx.facts_
    no_driver = facts is not None and (facts.no_gpu or facts.skip_gpu_install)
    if outcome.ok and no_driver and cfg.detect.cleanup_on_no_gpu:
        _cleanup(ctx)  # in the run's own journal, before run.end
    return outcome


def _cleanup(ctx: Context) -> None:
    """detect.cleanup_on_no_gpu: on a node that gets no driver (no GPU, or the
    SkipGpuDriverInstall tag), undo what bootfsm installed (as `bootfsm uninstall`), then
    tear a prebake down (install/teardown.py; AgentBaker's cleanUpGPUDrivers); the run
    still ends 0."""
    from bootfsm.install import teardown, uninstall

    ctx.state, ctx.state_row, ctx.state_deadline = "uninstall", None, None
    found = teardown.survey(ctx)  # before the records' markers go
    try:
        uninstall.run(ctx)
    except (BootError, TransientError) as exc:
        ctx.warn(f"cleanup of a node without a driver failed ({exc.code.name}): {exc}")
    ctx.state = "teardown"
    try:
        teardown.teardown(ctx, found)
    except (BootError, TransientError) as exc:
        ctx.warn(f"teardown of the prebaked driver failed ({exc.code.name}): {exc}")


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
