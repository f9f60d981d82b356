"""`bootfsm uninstall [--plan] [--json]`: remove what bootfsm installed, from its records.

Reads ``<state_dir>/installed.json`` (bootfsm/install/records.py) and undoes it newest
first (bootfsm/install/uninstall.py). ``--plan`` prints the steps and changes nothing
(no lock, no journal, no directory created). Otherwise it takes the node lock, journals
to ``<log_dir>/uninstall-<stamp>-<run id>.jsonl`` (``bootfsm trace FILE`` reads it),
and exits 0 when everything listed is undone (a second run finds no records: nothing
to do, 0) or with the failure's code (UNINSTALL_FAILED 108, the node lock's 11, the
state dir's 105/106, dpkg's lock 40).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bootfsm.commands.common import load_or_exit
from bootfsm.core.codes import Code, info
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.host import CommandResult, Host
from bootfsm.host.lock import NodeLock, own_dirs
from bootfsm.install import records
from bootfsm.install.uninstall import Step, plan, run
from bootfsm.machine.context import Context
from bootfsm.observe.journal import Journal, new_run_id

__all__ = ["main"]

SCHEMA = 1


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}


def _plan(cfg: Config, args: argparse.Namespace) -> int:
    host = Host(Path(args.root), env=_env())
    ctx = Context.create(cfg, host, Journal(None, run_id="plan"))
    try:
        steps = plan(ctx, records.load(host, cfg))
    except BootError as exc:
        return _failed(args, exc.code, exc.message)
    if args.json:
        doc = {"schema": SCHEMA, "kind": "uninstall.plan", "steps": [s.as_json() for s in steps]}
        print(json.dumps(doc, indent=2))
    elif not steps:
        print(f"bootfsm uninstall: nothing to do ({records.records_path(cfg)} lists nothing)")
    else:
        print("\n".join(s.line() for s in steps))
    return 0


def _failed(args: argparse.Namespace, code: Code, message: str) -> int:
    if args.json:
        doc = {
            "schema": SCHEMA,
            "kind": "uninstall",
            "code": int(code),
            "code_name": code.name,
            "message": message,
        }
        print(json.dumps(doc, indent=2))
    print(
        f"bootfsm: uninstall FAILED code={int(code)} {code.name}: {message.splitlines()[0]}"
        f" | hint: {info(code).hint}",
        file=sys.stderr,
    )
    for line in message.splitlines()[1:]:  # the failed command's output
        print(f"  {line}", file=sys.stderr)
    return int(code)


def _journal(host: Host, cfg: Config) -> tuple[Journal, Path]:
    run_id = new_run_id()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(host.wall()))
    path = host.path(cfg.run.log_dir) / f"uninstall-{stamp}-{run_id}.jsonl"
    return Journal(path, run_id=run_id, monotonic=host.monotonic), path


def _uninstall(cfg: Config, args: argparse.Namespace) -> int:
    host = Host(Path(args.root), env=_env())
    lock = NodeLock(host.path(f"{cfg.run.state_dir}/lock"))
    try:
        own_dirs(host, cfg.run.state_dir, cfg.run.log_dir)
        acquired = lock.acquire(args.wait_lock)
    except BootError as exc:
        return _failed(args, exc.code, exc.message)
    except OSError as exc:
        return _failed(args, Code.HOST_IO_ERROR, f"cannot take the node lock: {exc}")
    if not acquired:
        msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
        return _failed(args, Code.ANOTHER_RUN_IN_PROGRESS, msg)
    try:
        journal, path = _journal(host, cfg)
        ctx = Context.create(cfg, host, journal)
        ctx.state = "uninstall"

        def on_command(r: CommandResult) -> None:
            journal.event(
                "command",
                level="info" if r.ok else "warning",
                state=ctx.state,
                argv=list(r.argv),
                rc=r.returncode,
                duration_s=r.duration_s,
                output=r.output[-2000:],
            )

        host.on_command = on_command
        journal.event(
            "uninstall.start", durable=True, root=str(host.root), config_digest=cfg.digest()
        )
        return _steps(ctx, args, journal, path)
    finally:
        lock.release()


def _steps(ctx: Context, args: argparse.Namespace, journal: Journal, path: Path) -> int:
    def show(step: Step) -> None:
        if not args.json:
            print(step.line())

    code, message = Code.OK, ""
    steps: list[Step] = []
    kept: list[Step] = []
    try:
        steps, kept = run(ctx, on_step=show)
    except (BootError, TransientError) as exc:
        code, message = exc.code, exc.message
        output = getattr(exc, "detail", {}).get("output")
        if isinstance(output, str) and output.strip():
            message += "\n" + output.strip()[-800:]
    journal.event(
        "uninstall.end",
        durable=True,
        level="info" if code is Code.OK else "error",
        code=int(code),
        code_name=code.name,
        message=message.splitlines()[0] if message else "",
        kept=[s.target for s in kept],
    )
    journal.close()
    if code is not Code.OK:
        return _failed(args, code, message)
    if args.json:
        doc = {
            "schema": SCHEMA,
            "kind": "uninstall",
            "code": 0,
            "code_name": "OK",
            "steps": [s.as_json() for s in steps],
            "kept": [s.target for s in kept],
            "journal": str(path),
        }
        print(json.dumps(doc, indent=2))
    done = sum(1 for s in steps if s.action not in ("keep", "skip"))
    what = f"{done} step(s) done" if steps else "nothing to do"
    kept_text = f", kept {len(kept)} changed file(s) (warnings above)" if kept else ""
    print(f"bootfsm: uninstall OK: {what}{kept_text} | journal {path}", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    """`bootfsm uninstall` (``--plan``: print only)."""
    cfg = load_or_exit(args)
    if isinstance(cfg, int):
        return cfg
    return _plan(cfg, args) if args.plan else _uninstall(cfg, args)
