"""One provisioning run, end to end: lock, journal, signals, engine, checkpoint.

``execute`` is what `bootfsm run` (and the demo, and the tests) call. It always ends
with a terminal journal event and a checkpoint, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from bootfsm import __version__
from bootfsm.codes import Code, info
from bootfsm.config import Config
from bootfsm.context import Context
from bootfsm.deadline import Deadline
from bootfsm.engine import Interrupted, Outcome, drive
from bootfsm.errors import BootError
from bootfsm.host import CommandResult, Host
from bootfsm.http import Http
from bootfsm.journal import Journal, new_run_id
from bootfsm.lock import NodeLock

__all__ = ["RunOptions", "RunResult", "execute"]


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


@dataclass(frozen=True)
class RunResult:
    """The outcome plus where its journal is."""

    outcome: Outcome
    run_id: str
    journal: Path | None


def _checkpoint(host: Host, cfg: Config, data: dict[str, Any]) -> None:
    # a read-only or full state dir must not hide the real outcome
    with contextlib.suppress(BootError):
        host.write_atomic(f"{cfg.run.state_dir}/checkpoint.json", json.dumps(data) + "\n", 0o600)


def _prune(log_dir: Path, keep: int) -> None:
    runs = sorted(log_dir.glob("run-*.jsonl"))
    for old in runs[: max(0, len(runs) - keep)]:
        old.unlink(missing_ok=True)


def _on_command(journal: Journal, ctx: Context) -> Callable[[CommandResult], None]:
    def record(r: CommandResult) -> None:
        journal.event(
            "command",
            level="info" if r.ok else "warning",
            state=ctx.state,
            argv=list(r.argv),
            rc=r.returncode,
            duration_s=r.duration_s,
            timed_out=r.timed_out,
            output=r.output[-2000:],
        )

    return record


def execute(cfg: Config, opts: RunOptions) -> RunResult:
    """Run the machine on the node at ``opts.root``; never raises for node problems."""
    host = Host(opts.root, env=opts.env)
    lock = NodeLock(host.path(f"{cfg.run.state_dir}/lock"))
    if not lock.acquire(opts.wait_lock):
        msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
        return RunResult(Outcome(Code.ANOTHER_RUN_IN_PROGRESS, "", msg), "", None)
    try:
        return _locked(cfg, opts, host)
    finally:
        lock.release()


def _locked(cfg: Config, opts: RunOptions, host: Host) -> RunResult:
    run_id = new_run_id()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(host.wall()))
    log_dir = host.path(cfg.run.log_dir)
    jpath: Path | None = log_dir / f"run-{stamp}-{run_id}.jsonl"
    try:
        journal = Journal(
            jpath,
            run_id=run_id,
            console=opts.console,
            console_json=opts.console_json,
            monotonic=host.monotonic,
        )
    except OSError as exc:
        if opts.console is not None:
            opts.console.write(f"bootfsm: journal unavailable ({exc}); console only\n")
        jpath = None
        journal = Journal(
            None,
            run_id=run_id,
            console=opts.console,
            console_json=opts.console_json,
            monotonic=host.monotonic,
        )
    ctx = Context(
        config=cfg,
        host=host,
        http=Http(
            connect_timeout=cfg.fetch.connect_timeout,
            read_timeout=cfg.fetch.read_timeout,
            env=host.env,
        ),
        journal=journal,
        deadline=Deadline(cfg.run.deadline, host.monotonic),
    )
    host.on_command = _on_command(journal, ctx)
    journal.event(
        "run.start",
        durable=True,
        version=__version__,
        schema=1,
        root=str(host.root),
        config_path=opts.config_path,
        config_digest=cfg.digest(),
        deadline_s=cfg.run.deadline,
        pid=os.getpid(),
    )
    base = {"run_id": run_id, "journal": str(jpath) if jpath else "", "pid": os.getpid()}
    _checkpoint(host, cfg, {**base, "state": "detect", "outcome": "running"})

    def on_transition(src: str, dest: str, _: Outcome | None) -> None:
        _checkpoint(host, cfg, {**base, "state": dest, "outcome": "running"})
        if opts.on_state is not None:
            opts.on_state(dest)

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        outcome = drive(ctx, _registry(), _callbacks(), on_transition)
    except Interrupted as exc:
        host.stop_child()
        outcome = Outcome(
            Code.INTERRUPTED,
            ctx.state,
            f"interrupted by {exc.signame} in state {ctx.state or 'detect'}",
        )
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    kind = (
        "done" if outcome.ok else ("interrupted" if outcome.code is Code.INTERRUPTED else "failed")
    )
    journal.event(
        "run.end",
        durable=True,
        level="info" if outcome.ok else "error",
        outcome=kind,
        code=outcome.code.value,
        code_name=outcome.code.name,
        state=outcome.state,
        message=outcome.message,
        hint=info(outcome.code).hint,
        duration_s=round(journal.elapsed(), 4),
    )
    journal.close()
    _checkpoint(
        host,
        cfg,
        {
            **base,
            "state": outcome.state,
            "outcome": kind,
            "code": outcome.code.value,
            "code_name": outcome.code.name,
        },
    )
    if jpath is not None:
        _prune(jpath.parent, cfg.run.keep_journals)
    return RunResult(outcome, run_id, jpath)


def _registry() -> Mapping[str, Any]:
    from bootfsm.states import REGISTRY

    return dict(REGISTRY)


def _callbacks() -> Mapping[str, Callable[[Context], None]]:
    from bootfsm.states import CALLBACKS

    return dict(CALLBACKS)
