"""`bootfsm status [--json] [--wait --timeout SECONDS]`: where the current or last run is,
from the checkpoint, the lock's holder (never taking it) and the journal.

``--wait`` is bounded by ``--timeout``. Exit codes: the constants below, distinct from
every outcome code, else a failed run's own code.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bootfsm.commands.common import load_or_exit
from bootfsm.core.codes import Code, info, verdict_line
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.core.redact import redact_text
from bootfsm.host.host import Host
from bootfsm.observe.liveness import lock_holders, pid_exists
from bootfsm.observe.trace import latest_journal, load_run
from bootfsm.run.runner import checkpoint_problem

__all__ = ["DONE", "KILLED", "NEVER_STARTED", "RUNNING", "Status", "main", "probe"]

DONE = 0
RUNNING = 3
NEVER_STARTED = 4
KILLED = 5
STATUS_SCHEMA = 1
_POLL_S = 0.2
_WARNED: list[str] = []  # checkpoint warnings already printed by this process


@dataclass
class Status:
    """What ``bootfsm status`` reports (the JSON form is this, plus ``schema``)."""

    status: str  # done | failed | interrupted | running | killed | never-started
    exit: int
    state: str = ""
    run_id: str = ""
    pid: int | None = None
    code: int | None = None
    code_name: str = ""
    message: str = ""
    hint: str = ""
    journal: str = ""
    waited_s: float = 0.0
    timed_out: bool = False


def _checkpoint(host: Host, cfg: Config) -> dict[str, Any] | None:
    try:
        text = host.read_text(f"{cfg.run.state_dir}/checkpoint.json")
        data = json.loads(text) if text is not None else None  # empty: truncated
    except (BootError, ValueError) as exc:  # unreadable or torn: the journal still tells
        data, problem = None, str(exc)[:120]
    else:
        problem = "" if data is None else checkpoint_problem(data)
    if problem and not _WARNED:  # once, not at every --wait poll
        _WARNED.append(problem)
        print(
            f"bootfsm: warning: {cfg.run.state_dir}/checkpoint.json is unreadable ({problem}); "
            "treated as absent, the journal tells instead",
            file=sys.stderr,
        )
    return data if isinstance(data, dict) and not problem else None


def _from_journal(host: Host, cfg: Config) -> dict[str, Any] | None:
    """A checkpoint-like record from the newest journal (checkpoint missing or unreadable)."""
    path = latest_journal(host.path(cfg.run.log_dir))
    if path is None:
        return None
    r = load_run(path)
    return {
        "run_id": r.run_id,
        "journal": str(path),
        "pid": r.pid,
        "state": r.failed_state or (r.spans[-1].state if r.spans else ""),
        "outcome": r.outcome,
        "code": r.code,
        "code_name": r.code_name,
    }


def _finished(cp: dict[str, Any]) -> Status:
    outcome = str(cp.get("outcome"))
    code = cp.get("code")
    try:
        c = Code(int(code)) if code is not None else Code.INTERNAL_ERROR
    except ValueError:
        c = Code.INTERNAL_ERROR
    if outcome == "done":
        return Status("done", DONE, code=0, code_name="OK", message="node provisioned")
    return Status(outcome, int(c), code=int(c), code_name=c.name, hint=info(c).hint)


def _record(host: Host, cfg: Config) -> dict[str, Any] | None:
    """The checkpoint, else a checkpoint-like record from the newest journal."""
    return _checkpoint(host, cfg) or _from_journal(host, cfg)


def probe(host: Host, cfg: Config) -> Status:
    """The status right now (no waiting)."""
    # the record first, the lock second: a run takes the lock before it writes its first
    # record and writes its last before it lets the lock go, so a free lock seen after a
    # "running" record means that run ended in between: read the record again
    cp = _record(host, cfg)
    holders = lock_holders(host.path(f"{cfg.run.state_dir}/lock"))
    if not holders and cp is not None and cp.get("outcome") == "running":
        cp = _record(host, cfg)
    if cp is None and not holders:
        return Status("never-started", NEVER_STARTED, message="no checkpoint and no journal")
    st = _status(cp, holders)
    # a run holding the lock may be just starting, the record still the last run's
    if cp is not None and (not holders or cp.get("outcome") == "running"):
        st.state = str(cp.get("state", ""))
        st.run_id = str(cp.get("run_id", ""))
        st.journal = str(cp.get("journal", ""))
        st.pid = cp.get("pid") if isinstance(cp.get("pid"), int) else None
    return st


def _status(cp: dict[str, Any] | None, holders: set[int] | None) -> Status:
    """What the record (None: none yet) and the lock's holders (None: unknown) tell."""
    if holders or cp is None:  # someone holds the node lock: a run is in progress
        return Status("running", RUNNING)
    if cp.get("outcome") != "running":
        return _finished(cp)
    pid = cp.get("pid")
    alive = False if holders is not None else pid_exists(pid) if isinstance(pid, int) else None
    if alive is not False:
        return Status("running", RUNNING)
    return Status(
        "killed",
        KILLED,
        message="no process holds the node lock and the run never recorded an end",
        hint="rerun `bootfsm run`; it resumes where it stopped",
    )


def _details(st: Status) -> None:
    """Fill the message from the run's journal for a failed or interrupted run."""
    if st.status in ("failed", "interrupted") and st.journal:
        r = load_run(Path(st.journal))
        if r.run_id == st.run_id and r.message:
            st.message = redact_text(r.message.splitlines()[0])


#: The one-line form of each status; any other is a failed or interrupted run's verdict.
_LINES = {
    "done": "{run} provisioned the node (code 0)",
    "running": "{run} pid {pid} in state {state}{late}",
    "never-started": "no bootfsm run on this node yet{late}",
    "killed": "{run} stopped in state {state} without a verdict | hint: {hint}",
}
_LATE = {
    "running": " (still running after --timeout {:g} s)",
    "never-started": " (none started within --timeout {:g} s)",
}


def _line(st: Status, timeout: float) -> str:
    late = _LATE.get(st.status, "").format(timeout) if st.timed_out else ""
    shown = {**asdict(st), "pid": st.pid or "?", "state": st.state or "?"}
    run = f"run {st.run_id or '?'}"
    head = f"{st.status.replace('-', ' ')}: "
    if st.status not in _LINES:
        code = Code(st.code if st.code is not None else Code.INTERNAL_ERROR)
        return verdict_line(code, st.message, state=st.state, head=head + run)
    return f"bootfsm: {head}{_LINES[st.status].format(**shown, run=run, late=late)}"


def main(args: argparse.Namespace) -> int:
    """Print the status (after waiting, with --wait); exit with the status's code."""
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    host = Host(Path(args.root))
    start = host.monotonic()
    end = start + args.timeout
    st = probe(host, cfg)
    while args.wait and st.status in ("running", "never-started"):
        left = end - host.monotonic()
        if left <= 0:
            st.timed_out = True
            break
        host.sleep(min(_POLL_S, left))
        st = probe(host, cfg)
    st.waited_s = round(host.monotonic() - start, 3)
    _details(st)
    if args.json:
        print(json.dumps({"schema": STATUS_SCHEMA, "kind": "status", **asdict(st)}, indent=1))
    else:
        print(_line(st, args.timeout))
    return st.exit
