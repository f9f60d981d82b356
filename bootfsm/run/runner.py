"""One provisioning run, end to end: lock, journal, signals, engine, checkpoint.

``execute`` is what `bootfsm run` (and the demo, and the tests) call. It always ends
with a terminal journal event and a checkpoint, whatever happened.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from bootfsm import __version__
from bootfsm.core.codes import Code, info
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.host import CommandResult, Host
from bootfsm.host.lock import NodeLock, own_dirs
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Interrupted, Outcome, drive
from bootfsm.observe.journal import Journal, new_run_id
from bootfsm.observe.liveness import boot_id
from bootfsm.run import metrics
from bootfsm.run.cse_events import CseEvents

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
    on_status: Callable[[str], object] | None = None  # progress text within a state


@dataclass(frozen=True)
class RunResult:
    """The outcome plus where its journal is."""

    outcome: Outcome
    run_id: str
    journal: Path | None


CHECKPOINT_OUTCOMES = ("running", "done", "failed", "interrupted")


def checkpoint_problem(data: object) -> str:
    """What is wrong with the shape of checkpoint.json's parsed ``data`` ('' when nothing):
    the object ``_checkpoint`` writes (run_id, journal, pid, state, outcome; code and
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


def _checkpoint(host: Host, cfg: Config, data: dict[str, Any]) -> None:
    # a read-only or full state dir must not hide the real outcome
    with contextlib.suppress(BootError):
        host.write_atomic(f"{cfg.run.state_dir}/checkpoint.json", json.dumps(data) + "\n", 0o600)


def _journal_stamp(log_dir: Path, now: float) -> str:
    """The start stamp of a journal's name. Names must sort in start order (prune, trace
    and status take the last one as the newest run) even when the wall clock went back
    (an RTC reset before NTP) or two runs start within a second: then it is one second
    after the newest journal's stamp."""
    fmt = "%Y%m%dT%H%M%SZ"
    stamp = time.strftime(fmt, time.gmtime(now))
    newest = max((p.name[4:20] for p in log_dir.glob("run-*.jsonl")), default="")
    if newest < stamp:
        return stamp
    try:
        last = calendar.timegm(time.strptime(newest, fmt))
    except ValueError:  # a journal name not made by bootfsm
        return stamp
    return time.strftime(fmt, time.gmtime(last + 1))


def _prune(log_dir: Path, keep: int) -> None:
    runs = sorted(log_dir.glob("run-*.jsonl"))
    for old in runs[: max(0, len(runs) - keep)]:
        old.unlink(missing_ok=True)


def _on_command(journal: Journal, ctx: Context) -> Callable[[CommandResult], None]:
    def record(r: CommandResult) -> None:
        probe = ctx.probing and not r.timed_out  # a probe that hangs is a fault
        journal.event(
            "command",
            level="info" if r.ok or probe else "warning",
            state=ctx.state,
            argv=list(r.argv),
            rc=r.returncode,
            duration_s=r.duration_s,
            timed_out=r.timed_out,
            output=r.output[-2000:],
            **({"probe": True} if probe else {}),
        )

    return record


class _Interrupts:
    """SIGTERM/SIGINT for one run: stop the command in flight, then raise ``Interrupted``.

    Signals raise only inside ``armed()`` (the lock wait and the machine); one that
    arrives outside is remembered and raised when ``armed()`` is next entered, or
    ignored once the run has concluded. Only the first signal acts: a second one while
    stopping (systemd and a terminal may both send one) is ignored.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, host: Host) -> None:
        self.host = host
        self.pending: str | None = None
        self.stopped: list[str] = []  # argv of the command the signal stopped
        self._armed = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Raise ``Interrupted`` for a signal pending now or arriving inside the block."""
        if self.pending is not None:
            raise Interrupted(self.pending)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.pending is not None:
            return
        self.pending = signal.Signals(signum).name
        if not self._armed:
            return
        self._armed = False
        stopped = self.host.stop_child()  # the command in flight and its whole group
        if stopped is not None:
            self.stopped = stopped
        raise Interrupted(self.pending)


def execute(cfg: Config, opts: RunOptions) -> RunResult:
    """Run the machine on the node at ``opts.root``; never raises for node problems."""
    host = Host(opts.root, env=opts.env)
    lock = NodeLock(host.path(f"{cfg.run.state_dir}/lock"))
    with _Interrupts(host) as interrupts:
        try:
            own_dirs(host, cfg.run.state_dir, cfg.run.log_dir)
            with interrupts.armed():
                acquired = lock.acquire(opts.wait_lock)
        except BootError as exc:  # an unsafe or planted state dir, lock or log dir
            return RunResult(Outcome(exc.code, "", exc.message), "", None)
        except Interrupted as exc:
            msg = f"interrupted by {exc.signame} while waiting for the node lock {lock.path}"
            return RunResult(Outcome(Code.INTERRUPTED, "", msg), "", None)
        except OSError as exc:  # read-only or full state dir: say so, do not crash
            msg = (
                f"cannot take the node lock {lock.path}: {exc.strerror or exc}; "
                f"run.state_dir {cfg.run.state_dir} must be writable"
            )
            return RunResult(Outcome(Code.HOST_IO_ERROR, "", msg), "", None)
        if not acquired:
            msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
            return RunResult(Outcome(Code.ANOTHER_RUN_IN_PROGRESS, "", msg), "", None)
        try:
            return _locked(cfg, opts, host, interrupts)
        finally:
            lock.release()


def _locked(cfg: Config, opts: RunOptions, host: Host, interrupts: _Interrupts) -> RunResult:
    run_id = new_run_id()
    log_dir = host.path(cfg.run.log_dir)
    stamp = _journal_stamp(log_dir, host.wall())
    jpath: Path | None = log_dir / f"run-{stamp}-{run_id}.jsonl"
    try:
        journal = Journal(
            jpath,
            run_id=run_id,
            console=opts.console,
            console_json=opts.console_json,
            monotonic=host.monotonic,
            env=host.env,
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
            env=host.env,
        )
    ctx = Context.create(cfg, host, journal)
    ctx.status = opts.on_status
    host.on_command = _on_command(journal, ctx)
    this_boot = boot_id(host)
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
        boot_id=this_boot,
    )
    for problem in metrics.publish_start(host, cfg, boot_id=this_boot, version=__version__):
        journal.event("warning", level="warning", message=problem)
    base = {"run_id": run_id, "journal": str(jpath) if jpath else "", "pid": os.getpid()}
    _checkpoint(host, cfg, {**base, "state": "detect", "outcome": "running"})

    last_transition: list[str] = []

    cse = CseEvents.from_config(host, cfg, run_id)

    def on_transition(src: str, dest: str, ended: Outcome | None) -> None:
        last_transition[:] = [src, dest]
        _checkpoint(host, cfg, {**base, "state": dest, "outcome": "running"})
        cse.state_ended(src, dest, ended)
        if opts.on_state is not None:
            opts.on_state(dest)

    outcome: Outcome | None = None
    try:
        with interrupts.armed():
            outcome = drive(ctx, _registry(), _callbacks(), on_transition)
    except Interrupted as exc:
        if outcome is None:  # a signal after drive() returned does not undo its outcome
            outcome = _interrupted(journal, ctx.state, last_transition, exc, interrupts)
    assert outcome is not None
    if outcome.code is Code.NO_GPU and cfg.detect.cleanup_on_no_gpu:
        _cleanup(ctx)
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
    problems = cse.run_ended(outcome) + metrics.publish(host, cfg, jpath, run_id, outcome)
    if jpath is not None and any(k.startswith("OTEL_EXPORTER_OTLP") for k in host.env):
        problems += _export_trace(jpath, host.env)
    for problem in problems:
        journal.event("warning", level="warning", message=problem)
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


def _interrupted(
    journal: Journal,
    state: str,
    last_transition: list[str],
    exc: Interrupted,
    interrupts: _Interrupts,
) -> Outcome:
    """Journal what a signal interrupted and return the interrupted outcome."""
    between = bool(last_transition) and last_transition[0] == state
    where = last_transition[1] if between else (state or "detect")
    detail = ""
    if interrupts.stopped:
        detail = f" while running {os.path.basename(interrupts.stopped[0])} (stopped)"
    elif between:
        detail = f" between states ({state} done, {where} not started)"
    elif not state:
        detail = " before the first state started"
    journal.event(
        "run.interrupted",
        durable=True,
        level="warning",
        signal=exc.signame,
        state=where,
        between_states=between,
        command=interrupts.stopped,
    )
    message = f"interrupted by {exc.signame} in state {where}{detail}"
    return Outcome(Code.INTERRUPTED, where, message)


def _registry() -> Mapping[str, Any]:
    from bootfsm.states import REGISTRY

    return dict(REGISTRY)


def _callbacks() -> Mapping[str, Callable[[Context], None]]:
    from bootfsm.states import CALLBACKS

    return dict(CALLBACKS)
