"""One run session, what run, bake, fetch and uninstall share (docs/architecture.md):
node lock, journal, signals (code 12), Context, ``command`` events, ``run.start`` and
``run.end``, and the checkpoint for `bootfsm run`. The body drives the engine."""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bootfsm import __version__
from bootfsm.core.codes import Code, info
from bootfsm.core.config import Config
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError
from bootfsm.host.host import CommandResult, Host
from bootfsm.host.lock import NodeLock, own_dirs
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Interrupted, Outcome, drive, interruption
from bootfsm.machine.table import TRANSITIONS, TransitionRow
from bootfsm.observe.journal import Journal, new_run_id
from bootfsm.observe.liveness import boot_id
from bootfsm.run.interrupts import Interrupts

__all__ = ["Session", "SessionOptions", "SessionResult", "journal_stamp", "run_session"]

STAMP = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class SessionOptions:
    """One session: its kind (the journal's prefix), the node, the console, the lock wait."""

    kind: str = "run"
    root: Path = Path("/")
    config_path: str = ""
    console: IO[str] | None = None
    console_json: bool = False
    wait_lock: float = 0.0
    env: Mapping[str, str] | None = None
    deadline_s: float | None = None  # None: run.deadline
    deadline: Deadline | None = None  # already running (the lock wait counts): the hook's
    dirs: tuple[str, ...] = ()  # more of bootfsm's own directories to create or check
    checkpoint: bool = False  # keep checkpoint.json current (the node's run only)
    start_fields: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionResult:
    """Outcome, run id, journal (None: refused or console only), ``run.end``'s duration."""

    outcome: Outcome
    run_id: str
    journal: Path | None
    duration_s: float = 0.0


def journal_stamp(names: list[str], kind: str, now: float) -> str:
    """The start stamp of a new ``kind`` journal, given the names in the log dir; always
    after the newest one's, which prune, trace and status take as the latest."""
    stamp = time.strftime(STAMP, time.gmtime(now))
    prefix = f"{kind}-"
    width = len(stamp)
    mine = [n[len(prefix) : len(prefix) + width] for n in names if n.startswith(prefix)]
    newest = max(mine, default="")
    if newest < stamp:  # else the clock went back (an RTC reset before NTP) or same second
        return stamp
    try:
        last = calendar.timegm(time.strptime(newest, STAMP))
    except ValueError:  # a journal name not made by bootfsm
        return stamp
    return time.strftime(STAMP, time.gmtime(last + 1))


def run_session(
    cfg: Config, opts: SessionOptions, body: Callable[[Session], Outcome]
) -> SessionResult:
    """Take the lock, run ``body`` in a journaled session, always end with ``run.end``.
    Never raises for node problems: a refused lock is an outcome with no journal."""
    host = Host(opts.root, env=opts.env)
    lock = NodeLock(host.path(f"{cfg.run.state_dir}/lock"))
    with Interrupts(host) as interrupts:
        try:
            own_dirs(host, cfg.run.state_dir, cfg.run.log_dir, *opts.dirs)
            with interrupts.armed():
                acquired = lock.acquire(opts.wait_lock)
        except BootError as exc:  # an unsafe or planted state dir, lock or log dir
            return SessionResult(Outcome(exc.code, "", exc.message), "", None)
        except Interrupted as exc:
            msg = f"interrupted by {exc.signame} while waiting for the node lock {lock.path}"
            return SessionResult(Outcome(Code.INTERRUPTED, "", msg), "", None)
        except OSError as exc:  # read-only or full state dir: say so, do not crash
            msg = (
                f"cannot take the node lock {lock.path}: {exc.strerror or exc}; "
                f"run.state_dir {cfg.run.state_dir} must be writable"
            )
            return SessionResult(Outcome(Code.HOST_IO_ERROR, "", msg), "", None)
        if not acquired:
            msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
            return SessionResult(Outcome(Code.ANOTHER_RUN_IN_PROGRESS, "", msg), "", None)
        try:
            return Session(cfg, opts, host, interrupts).run(body)
        finally:
            lock.release()


class Session:
    """The locked part: journal, context, command events, run.start/run.end, checkpoint."""

    def __init__(self, cfg: Config, opts: SessionOptions, host: Host, interrupts: Interrupts):
        self.cfg, self.opts, self.host, self.interrupts = cfg, opts, host, interrupts
        self.run_id = new_run_id()
        self.journal, self.path = self._open_journal()
        self.ctx = Context.create(cfg, host, self.journal, opts.deadline_s, opts.deadline)
        host.on_command = self._record
        self.outcome: Outcome | None = None  # what drive() returned
        self.end_fields: dict[str, object] = {}  # more run.end fields (bake: changed...)
        self.after_end: list[Callable[[Outcome], list[str]]] = []  # problems -> warnings
        self.last_transition: list[str] = []

    # -- journal ------------------------------------------------------------------------
    def _open_journal(self) -> tuple[Journal, Path | None]:
        o, kind = self.opts, self.opts.kind
        log_dir = self.cfg.run.log_dir
        names = [p.rsplit("/", 1)[-1] for p in self.host.glob(f"{log_dir}/{kind}-*.jsonl")]
        stamp = journal_stamp(names, kind, self.host.wall())
        path: Path | None = self.host.path(f"{log_dir}/{kind}-{stamp}-{self.run_id}.jsonl")
        kw: dict[str, Any] = {"run_id": self.run_id, "console": o.console}
        kw.update(console_json=o.console_json, monotonic=self.host.monotonic, env=self.host.env)
        try:
            return Journal(path, **kw), path
        except OSError as exc:
            if o.console is not None:
                o.console.write(f"bootfsm: journal unavailable ({exc}); console only\n")
            return Journal(None, **kw), None

    def _prune(self) -> None:
        """Keep the newest ``run.keep_journals`` journals of this kind (names sort by time),
        this run's own always among them: 0 and 1 keep only it."""
        pattern = f"{self.cfg.run.log_dir}/{self.opts.kind}-*.jsonl"
        own = self.path.name if self.path is not None else ""
        old = [p for p in self.host.glob(pattern) if p.rsplit("/", 1)[-1] != own]
        for p in old[: max(0, len(old) - max(0, self.cfg.run.keep_journals - 1))]:
            with contextlib.suppress(OSError):
                self.host.remove(p)

    def _record(self, r: CommandResult) -> None:
        """The ``command`` event of every command the host ran."""
        probe = self.ctx.probing and not r.timed_out  # a probe that hangs is a fault
        self.journal.event(
            "command",
            level="info" if r.ok or probe else "warning",
            state=self.ctx.state,
            argv=list(r.argv),
            rc=r.returncode,
            duration_s=r.duration_s,
            spawn_s=r.spawn_s,
            timed_out=r.timed_out,
            output=r.output[-2000:],
            **({"probe": True} if probe else {}),
        )

    def checkpoint(
        self, state: str, outcome: str, *, durable: bool = False, **fields: object
    ) -> None:
        """checkpoint.json (``checkpoint=True`` only); a write failure never hides the real
        outcome. Only the last is ``durable``: a transition's is a hint the journal backs."""
        if not self.opts.checkpoint:
            return
        data = {"run_id": self.run_id, "journal": str(self.path or ""), "pid": os.getpid()}
        data.update(state=state, outcome=outcome, **fields)
        with contextlib.suppress(BootError):
            path = f"{self.cfg.run.state_dir}/checkpoint.json"
            self.host.write_atomic(path, json.dumps(data) + "\n", 0o600, durable=durable)

    # -- the run ------------------------------------------------------------------------
    def drive(
        self,
        registry: Mapping[str, Any],
        callbacks: Mapping[str, Callable[[Context], None]],
        transitions: tuple[TransitionRow, ...] = TRANSITIONS,
        on_transition: Callable[[str, str, Outcome | None], None] | None = None,
    ) -> Outcome:
        """Drive the engine over ``transitions``; each transition updates the checkpoint."""

        def moved(src: str, dest: str, ended: Outcome | None) -> None:
            self.last_transition[:] = [src, dest]
            self.checkpoint(dest, "running")
            if on_transition is not None:
                on_transition(src, dest, ended)

        self.outcome = drive(self.ctx, registry, callbacks, moved, transitions)
        return self.outcome

    def run(self, body: Callable[[Session], Outcome]) -> SessionResult:
        """run.start, the body (signals armed), run.end, close, checkpoint, prune."""
        j = self.journal
        start: dict[str, Any] = {
            "kind": self.opts.kind,
            "version": __version__,
            "schema": 1,
            "root": str(self.host.root),
            "config_path": self.opts.config_path,
            "config_digest": self.cfg.digest(),
            "deadline_s": self.ctx.deadline.seconds,
            "pid": os.getpid(),
            "boot_id": boot_id(self.host),
            **self.opts.start_fields,
        }
        j.event("run.start", durable=True, **start)
        self.checkpoint("detect", "running")
        outcome = self._body(body)
        kind = "done" if outcome.ok else "failed"
        kind = "interrupted" if outcome.code is Code.INTERRUPTED else kind
        duration = round(j.elapsed(), 4)
        j.event(
            "run.end",
            durable=True,
            level="info" if outcome.ok else "error",
            kind=self.opts.kind,
            outcome=kind,
            code=outcome.code.value,
            code_name=outcome.code.name,
            state=outcome.state,
            message=outcome.message,
            hint=info(outcome.code).hint,
            duration_s=duration,
            **self.end_fields,
        )
        for hook in self.after_end:
            for problem in hook(outcome):
                j.event("warning", level="warning", message=problem)
        j.close()
        code = {"code": outcome.code.value, "code_name": outcome.code.name}
        self.checkpoint(outcome.state, kind, durable=True, **code)
        if self.path is not None:
            self._prune()
        return SessionResult(outcome, self.run_id, self.path, duration)

    def _body(self, body: Callable[[Session], Outcome]) -> Outcome:
        try:
            with self.interrupts.armed():
                return body(self)
        except Interrupted as exc:
            # a signal after drive() returned does not undo its outcome
            return self.outcome or self._interrupted(exc)
        except Exception as exc:
            if (stop := interruption(exc)) is not None:  # what the signal broke on its way
                return self.outcome or self._interrupted(stop)
            if isinstance(exc, BootError):  # the body's own steps around the engine
                return Outcome(exc.code, self.ctx.state, exc.message)
            # a bug: still end with a documented code and a journal
            self.journal.event("run.error", level="error", traceback=traceback.format_exc(8))
            return Outcome(Code.INTERNAL_ERROR, self.ctx.state, f"{type(exc).__name__}: {exc}")

    def _interrupted(self, exc: Interrupted) -> Outcome:
        """Journal what a signal interrupted and return the interrupted outcome."""
        state, last = self.ctx.state, self.last_transition
        between = bool(last) and last[0] == state
        where = last[1] if between else (state or "detect")
        detail = ""
        if self.interrupts.stopped:
            detail = f" while running {os.path.basename(self.interrupts.stopped[0])} (stopped)"
        elif between:
            detail = f" between states ({state} done, {where} not started)"
        elif not state:
            detail = " before the first state started"
        self.journal.event(
            "run.interrupted",
            durable=True,
            level="warning",
            signal=exc.signame,
            state=where,
            between_states=between,
            command=self.interrupts.stopped,
        )
        message = f"interrupted by {exc.signame} in state {where}{detail}"
        return Outcome(Code.INTERRUPTED, where, message)
